"""The feeder's read-ahead (worker/feeder/readahead.py): slices come from what the scan
read, a long backlog is refilled a few thousand records per seek, never a seek per slice
(issue 33, item 2: four batches cost 188 seeks of about 35 ms, 1,725 req/s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from confluent_kafka import Message, TopicPartition

from batcher.fairshare import FairShare
from tests.unit.worker.fakes import FakeMessage
from worker.feeder.index import PendingIndex
from worker.feeder.readahead import READ_AHEAD, ReadAhead


class Log:
    """The pending partition, read by hand: ``assign`` is a seek."""

    def __init__(self, batches: Sequence[str]) -> None:
        self.records = [
            cast(Message, FakeMessage(("p", 0), offset, None, batch.encode(), None))
            for offset, batch in enumerate(batches)
        ]
        self.at = 0
        self.seeks = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.at = partitions[0].offset
        self.seeks += 1

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list[Message]:
        taken = self.records[self.at : self.at + num_messages]
        self.at += len(taken)
        return taken


def interleaved(batches: int, run: int, total: int) -> list[str]:
    """``batches`` publishers writing at once, in runs of ``run`` records each."""
    return [f"b{(i // run) % batches}" for i in range(total)]


def move_all(layout: list[str], quantum: int = 64) -> tuple[dict[str, list[int]], Log, ReadAhead]:
    log, index, fair = Log(layout), PendingIndex(), FairShare(quantum)
    ahead = ReadAhead(log, "p", index)
    for m in log.records:  # the scan
        batch = (m.value() or b"").decode()
        first = batch not in index.batches
        offset = m.offset()
        assert offset is not None and index.scan(offset, batch, 1.0)
        ahead.scanned(batch, m, first)
        fair.add(batch, 1)
    moved: dict[str, list[int]] = {}
    while (picked := fair.next(512)) is not None:
        batch, count = picked
        taken = ahead.take(batch, count)
        assert len(taken) == count
        moved.setdefault(batch, []).extend(cast(Any, m).offset() for m in taken)
    return moved, log, ahead


def test_every_record_is_moved_once_in_its_batchs_order_with_a_seek_per_thousands() -> None:
    layout = interleaved(4, 200, 40_000)
    moved, log, ahead = move_all(layout)
    for batch, offsets in moved.items():
        assert offsets == [o for o, b in enumerate(layout) if b == batch]
    # 40,000 records in 625 slices of 64: a seek per refill of READ_AHEAD records
    assert log.seeks == ahead.seeks <= 40_000 // READ_AHEAD + 4
    assert not index_left(ahead)


def test_a_batch_the_scan_kept_whole_needs_no_read_at_all() -> None:
    moved, log, _ = move_all(interleaved(64, 10, 64 * 50))
    assert sum(len(o) for o in moved.values()) == 64 * 50
    assert log.seeks == 0


def index_left(ahead: ReadAhead) -> int:
    return sum(len(kept) for kept in ahead._kept.values())
