"""A record or batch that raises in the feeder is quarantined, never retried for ever
(worker/feeder/plan.py, forward.py; issue 38): it leaves fair share, a stop naming why
goes to the control topic (the workers answer its requests 4007), its records are
drained, a record the producer refuses is dead-lettered, and every other batch goes on.
Every pending record ends exactly once: moved to the requests topic (one answer from a
worker) or dead-lettered (that is its answer)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher.fairshare import FairShare
from batcher.tiers import Tiers
from tests.unit.worker.fakes import FakeClients, FakeControl, FakeMessage, GatedEngine
from tests.unit.worker.rig import P0, loop_config, rig
from worker.errors import ErrorCode
from worker.feeder import readahead, sweep
from worker.feeder.forward import forward
from worker.feeder.headers import Charging
from worker.feeder.index import PendingIndex
from worker.feeder.naming import pending_headers, tokens_header
from worker.feeder.plan import Planner
from worker.feeder.readahead import ReadAhead
from worker.feeder.stops import Drain
from worker.kafka.cancellations import Cancellations, Stop

LIMIT = 1000  # the producer's message.max.bytes in these tests


class Hostile(FakeMessage):
    """A record whose header names the client cannot decode."""

    def headers(self) -> Any:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


class Log:
    """The pending partition; records in ``lost`` are gone (a truncated log)."""

    def __init__(self, records: Sequence[Message], lost: frozenset[int] = frozenset()) -> None:
        self.records = list(records)
        self.lost = lost
        self.at = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.at = partitions[0].offset

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list[Message]:
        taken = self.records[self.at : self.at + num_messages]
        self.at += len(taken)
        return [m for m in taken if m.offset() not in self.lost]


@dataclass
class Producer:
    """librdkafka's produce as far as the feeder meets it: a record over LIMIT bytes is
    refused at once."""

    sent: list[tuple[str, Message | None, list[tuple[str, bytes]]]] = field(default_factory=list)

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        value, key = kwargs.get("value") or b"", kwargs.get("key") or b""
        headers = kwargs.get("headers") or []
        size = len(value) + len(key) + sum(len(n) + len(v or b"") for n, v in headers)
        if size > LIMIT:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        self.sent.append((topic, kwargs.get("source"), list(headers)))


class Feeder:
    """The feeder's pure parts over an in-memory pending partition: scan, then steps."""

    def __init__(
        self,
        records: Sequence[Message],
        lost: frozenset[int] = frozenset(),
        engine: int | None = None,
    ) -> None:
        self.log = Log(records, lost)
        self.index = PendingIndex()
        self.fair = Tiers(4)
        self.control = FakeControl()
        self.drain = Drain(Cancellations(self.control), self.fair, self.index)
        self.ahead = ReadAhead(self.log, "pending", self.index)
        self.planner = Planner(
            self.index, self.fair, self.ahead, self.drain, Charging(), engine=engine
        )
        self.moved: Counter[int] = Counter()
        self.dead: Counter[int] = Counter()
        self.letters: dict[int, list[tuple[str, bytes]]] = {}
        self.stops: list[Stop] = []
        self.abandoned = 0

    def run(self, room: int = 7) -> None:
        scan = [m for m in self.log.records if m.offset() not in self.log.lost]
        for start in range(0, len(scan), 5):  # the scan reads as it goes, steps between
            self.planner.note(scan[start : start + 5])
            self.step(room)
        for _ in range(10_000):
            if not self.index.batches:
                return
            self.step(room)
        raise AssertionError(f"still waiting: {list(self.index.batches)}")

    def step(self, room: int) -> None:
        step = self.planner.plan(room, 16)
        self.stops.extend(step.stops)
        self.abandoned += sum(step.abandoned.values())
        for _, records in step.slices:
            for m in records:
                producer = Producer()
                offset = cast(int, m.offset())
                if forward(producer, "requests", "dead", m, lambda *_: None):
                    self.moved[offset] += 1
                else:
                    self.dead[offset] += 1
                    self.letters[offset] = producer.sent[-1][2]


def record(offset: int, batch: str, value: bytes = b"v" * 40, **headers: bytes) -> Message:
    pairs: list[tuple[str, bytes | str | None]] = [
        *pending_headers(batch, 1.0, batch),
        tokens_header(9),
    ]
    pairs.extend((name.replace("_", "-"), v) for name, v in headers.items())
    return cast(Message, FakeMessage(("pending", 0), offset, f"id-{offset}".encode(), value, pairs))


def test_a_record_too_large_to_move_is_dead_lettered_and_its_batch_goes_on() -> None:
    records = [record(o, "a") for o in range(6)]
    records[2] = record(2, "a", b"x" * 2 * LIMIT)
    feeder = Feeder(records)
    feeder.run()
    assert sorted(feeder.moved) == [0, 1, 3, 4, 5]
    assert feeder.dead == Counter({2: 1})
    letter = dict(feeder.letters[2])
    assert letter["error-code"] == str(int(ErrorCode.OVER_LIMIT)).encode()
    assert b"could not move this record to requests" in letter["error-message"]
    assert letter["source"] == b"pending/0/2"


def test_a_batch_whose_share_raises_is_quarantined_drained_and_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = FairShare.add

    def add(self: FairShare, batch_id: str, *args: Any, **kwargs: Any) -> None:
        if batch_id == "bad":
            raise ZeroDivisionError("a bug")
        plain(self, batch_id, *args, **kwargs)

    monkeypatch.setattr(FairShare, "add", add)
    layout = ["good", "bad", "good", "bad", "other", "bad"]
    feeder = Feeder([record(o, b) for o, b in enumerate(layout)])
    feeder.run()
    assert feeder.moved == Counter(range(6))  # the bad batch too: drained, to be answered
    (stop,) = feeder.stops
    assert (stop.batch_id, stop.code) == ("bad", ErrorCode.BATCH_QUARANTINED)
    assert "ZeroDivisionError: a bug" in stop.message
    assert Stop.decode(stop.encode()) == stop  # as the workers read it back


def test_a_batch_whose_records_are_gone_is_quarantined_then_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(readahead, "READ_AHEAD", 2)  # its records are read back, not kept
    monkeypatch.setattr(sweep, "READ_TIMEOUT_S", 0.05)
    layout = ["gone"] * 4 + ["other"] * 4
    records = [record(o, b) for o, b in enumerate(layout)]
    feeder = Feeder(records)
    for m in records:  # scanned before they were lost (a truncated log)
        feeder.planner.note([m])
    feeder.log.lost = frozenset({2, 3})
    for _ in range(50):
        feeder.step(7)
    assert sorted(feeder.moved) == [0, 1, 4, 5, 6, 7]
    assert [s.batch_id for s in feeder.stops] == ["gone"]
    assert feeder.abandoned == 2 and not feeder.index.batches


def test_a_record_whose_headers_cannot_be_read_is_moved_as_headerless() -> None:
    hostile = cast(Message, Hostile(("pending", 0), 1, b"k", b"v", None))
    feeder = Feeder([record(0, "a"), hostile, record(2, "a")])
    feeder.run()
    assert feeder.moved == Counter({0: 1, 1: 1, 2: 1})


header_values = st.one_of(st.none(), st.binary(max_size=24), st.text(max_size=24))
hostile_headers = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "batchpipe-batch-id",
                "batchpipe-key",
                "batchpipe-weight",
                "batchpipe-tokens",
                "content-type",
                "x",
            ]
        ),
        st.one_of(
            header_values,
            st.sampled_from([b"1e-308", b"5e-324", b"nan", b"9" * 5000, str(10**400).encode()]),
        ),
    ),
    max_size=6,
)
records_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", ""]),
        hostile_headers,
        st.one_of(st.none(), st.binary(max_size=64), st.just(b"z" * 2 * LIMIT)),
        st.booleans(),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(records_strategy, st.integers(1, 40), st.integers(1, 8), st.sampled_from(["", "a", "b"]))
def test_any_pending_headers_and_values_get_exactly_one_answer_each(
    drawn: list[tuple[str, list[tuple[str, Any]], bytes | None, bool]],
    room: int,
    read_ahead: int,
    faulty: str,
) -> None:
    """No exception escapes the feeder's steps, and every record is moved or dead-lettered
    exactly once, whatever its headers and value, and when one batch's share raises."""
    plain = FairShare.add

    def add(self: FairShare, batch_id: str, *args: Any, **kwargs: Any) -> None:
        if faulty and batch_id == faulty:
            raise RuntimeError("injected")
        plain(self, batch_id, *args, **kwargs)

    records: list[Message] = []
    for offset, (batch, headers, value, hostile) in enumerate(drawn):
        pairs = [*pending_headers(batch, 1.0, batch), *headers] if batch else headers
        kind = Hostile if hostile and offset % 7 == 3 else FakeMessage
        records.append(cast(Message, kind(("pending", 0), offset, b"k", value, pairs)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(readahead, "READ_AHEAD", read_ahead)
        patch.setattr(FairShare, "add", add)
        feeder = Feeder(records)
        feeder.run(room)
    answered = feeder.moved + feeder.dead
    assert answered == Counter(range(len(records)))
    assert {s.batch_id for s in feeder.stops} <= {faulty}


def test_a_kafka_error_that_is_not_the_records_fails_the_step_instead() -> None:
    """An abortable transaction refuses every produce with _STATE: dead-lettering the
    record then would answer a request that the next step moves again."""

    class Aborting:
        def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
            raise KafkaException(KafkaError(KafkaError._STATE, "abortable"))

    with pytest.raises(KafkaException):
        forward(Aborting(), "requests", "dead", record(0, "a"), lambda *_: None)


def test_the_workers_answer_a_quarantined_batch_4007_naming_the_cause() -> None:
    """The feeder's stop goes by the one path that answers a stopped batch: a worker that
    has read it answers each of the batch's requests once, unrun, with 4007 and the
    cause; another batch runs."""
    with rig(loop_config(), GatedEngine()) as r:
        control = cast(FakeClients, r.worker.clients).fake_control
        stop = Stop("evil", "quarantined", 1.0, "reading its records back: ValueError: x")
        control.values.append(stop.encode())
        for i in range(3):
            r.broker.submit(0, f"e{i}", f"hello {i}", batch_id="evil")
        r.broker.submit(0, "ok", "hello", batch_id="good")
        r.consumer.rebalance("assign", [P0])
        r.engine.open()
        ids = {"e0", "e1", "e2", "ok"}
        r.step_until(lambda: r.settled(ids), "everything answered")
        assert set(r.answers().values()) == {1}
        results = {res.custom_id: res for res in r.results()}
        assert results["ok"].status == "completed"
        for i in range(3):
            error = results[f"e{i}"].error
            assert error is not None and error.code == ErrorCode.BATCH_QUARANTINED
            assert "batch_quarantined" in error.message and "ValueError: x" in error.message
