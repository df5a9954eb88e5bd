"""The results reader stops at the answer that completes a batch (found through the API:
bob's 10 requests behind alice's 2,000 waited for the rest of every 0.2 s read window,
and ended 0.25-0.3 s after their last answer was on the topic)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from msgspec import structs

from batchpipe.api import follow as follow_module
from batchpipe.api.follow import ResultsFollower
from batchpipe.api.records import BatchRecord, Counts
from tests.unit.batchpipe.api.test_records import BATCH
from worker.config import Config
from worker.errors import ErrorCode
from worker.loop.jobs import Identity, failed
from worker.wire.codec import encode_result


@dataclass
class _Record:
    _value: bytes
    _headers: list[tuple[str, str | bytes | None]]
    _offset: int

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        return self._headers

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None


class _Topic:
    """One partition of answers, fetched ``FETCH`` at a time: a poll that may wait fetches
    the next ones once the fetched are read, a poll that may not returns None there."""

    FETCH = 10

    def __init__(self, answers: list[tuple[str, str, int]]) -> None:
        identity = Identity(worker_id="w", model="echo")
        self.records = []
        for offset, (batch_id, custom_id, total) in enumerate(answers):
            answer = failed(custom_id, ErrorCode.ENGINE_FAILED, "x", identity=identity)
            value, headers = encode_result(
                structs.replace(answer, batch_id=batch_id, batch_total=total)
            )
            self.records.append(_Record(value, list(headers), offset))
        self.next = 0
        self.fetched = 0

    def poll(self, timeout: float = 0) -> _Record | None:
        if self.next >= self.fetched and timeout > 0:
            self.fetched = min(len(self.records), self.fetched + self.FETCH)
        if self.next >= self.fetched:
            time.sleep(min(timeout, 0.01))
            return None
        self.next += 1
        return self.records[self.next - 1]

    def assign(self, partitions: object) -> None:
        pass

    def close(self) -> None:
        pass


def _batch(batch_id: str, total: int) -> BatchRecord:
    return replace(BATCH, id=batch_id, status="in_progress", counts=Counts(total=total))


@pytest.fixture
def topic(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Topic]:
    # a small batch's 3 answers among a large one's, then more of the large one's
    answers = [("big", f"b{i}", 1_000) for i in range(5)]
    answers += [("small", f"s{i}", 3) for i in range(3)]
    answers += [("big", f"b{i}", 1_000) for i in range(5, 205)]
    fake = _Topic(answers)
    monkeypatch.setattr(follow_module, "open_reader", lambda kafka, topic, since: (fake, 1))
    monkeypatch.setattr(follow_module, "start_offsets", lambda *args: [])
    yield fake


def test_the_read_stops_at_the_answer_that_completes_a_batch(topic: _Topic, tmp_path: Path) -> None:
    follower = ResultsFollower(Config(), tmp_path)
    active = [_batch("big", 1_000), _batch("small", 3)]
    assert follower.follow(active) is True  # stopped early: more may be waiting
    small = follower.tally("small")
    assert small is not None and small.complete
    # what was fetched with it is counted (without a wait), not the 198 answers behind it
    assert follower.records_read == _Topic.FETCH
    # the next read goes on from there, to the end of what is written
    while follower.records_read < len(topic.records):
        assert follower.follow(active) is False
    big = follower.tally("big")
    assert big is not None and big.answered == 205 and not big.complete


def test_batches_completing_together_end_in_one_read(topic: _Topic, tmp_path: Path) -> None:
    """Review s5 #2: a pass per completed batch was a full lifecycle step each, back to
    back, for a burst of small batches answered together."""
    follower = ResultsFollower(Config(), tmp_path)
    topic.records[8:8] = _Topic([("tiny", "t0", 1)]).records
    for offset, record in enumerate(topic.records):
        record._offset = offset
    active = [_batch("big", 1_000), _batch("small", 3), _batch("tiny", 1)]
    assert follower.follow(active) is True
    for done in ("small", "tiny"):
        tally = follower.tally(done)
        assert tally is not None and tally.complete, done


def test_a_repeated_last_answer_does_not_stop_the_read_again(topic: _Topic, tmp_path: Path) -> None:
    follower = ResultsFollower(Config(), tmp_path)
    topic.records.insert(8, topic.records[7])  # the small batch's last answer, twice
    for offset, record in enumerate(topic.records):
        record._offset = offset
    active = [_batch("big", 1_000), _batch("small", 3)]
    assert follower.follow(active) is True
    assert follower.records_read == _Topic.FETCH
    while follower.records_read < len(topic.records):  # the repeat stops nothing
        assert follower.follow(active) is False
