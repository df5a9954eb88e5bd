"""A refill of the read-ahead is a sweep: one sequential read of the pending partition.

Publishers writing at once interleave their batches in the pending partition (1,000
publishers in chunks of 20 records). Reading one batch back at a time re-read every other
batch's records between its own: 8,362 seeks and 42× the data to feed 200k records
(issue 38). A :class:`Sweep` reads the partition sequentially from the refilled batch's
next record and offers *every* record it reads to the batch it belongs to
(:meth:`worker.feeder.readahead.ReadAhead.hand`), which keeps it when it is that batch's
next record not kept — so one sequential pass refills every batch whose records it
crosses, and the next refill continues where it stopped (records fetched and not yet
handed out wait in ``_unread``) instead of seeking. A new sweep starts at the earliest
next record, within what the budget holds before it, of the batches short of their
share, so that one sweep serves a round of fair share. A batch the sweep read a record of
but could not keep (the budget, its share) is *missed* until the next seek: its later
records are not its next ones in this sweep.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaException, Message, TopicPartition

from worker.errors import BatchpipeError
from worker.feeder.headers import batch_of, headers_of
from worker.feeder.index import PendingIndex

#: a refill seeks over a gap of other batches' records longer than this, else reads on
GAP_SEEK = 4096
#: records a refill fetches at a time
FETCH = 500
READ_TIMEOUT_S = 30.0


class FeederError(BatchpipeError, RuntimeError):
    """The mover cannot go on (a slice could not be read back); build a new one."""


class Reader(Protocol):
    """The consumer a refill reads with: assigned by hand, never subscribed."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[Message]: ...


class Ahead(Protocol):
    """What a sweep hands its records to: the read-ahead
    (:class:`worker.feeder.readahead.ReadAhead`), which keeps each batch's next ones."""

    def buffer(self, batch_id: str) -> deque[Message]: ...

    def share(self) -> int: ...

    def expect(self, batch_id: str) -> tuple[int, int] | None: ...

    def fits(self, size: int) -> bool: ...

    def short(self, batch_id: str, share: int) -> bool: ...

    def budget_records(self) -> float: ...

    def hand(
        self,
        owner: str,
        m: Message,
        offset: int,
        refilled: str,
        must: bool,
        share: int,
        since: int,
    ) -> bool: ...


def size_of(m: Message) -> int:
    return len(m.value() or b"") + len(m.key() or b"")


def offset_of(m: Message) -> int:
    offset = m.offset()
    assert offset is not None
    return offset


class Sweep:
    def __init__(self, reader: Reader, topic: str, index: PendingIndex, ahead: Ahead) -> None:
        self._reader = reader
        self._topic = topic
        self._index = index
        self._ahead = ahead
        self._unread: deque[Message] = deque()  # fetched, not handed out yet
        self._reader_at = -1  # the offset the reader fetches next; -1: not assigned
        self._start = 0  # where the current sweep began (its last seek)
        self._missed: set[str] = set()  # batches this sweep read a record of but not kept
        self.seeks = 0
        self.reads = 0  # records refills read (a measure of re-reading)

    def refill(self, batch_id: str, slice_: int) -> deque[Message]:
        """Sweep the partition until ``batch_id`` has its share of the budget (at least
        ``slice_`` records, budget or not), handing what else the sweep reads to the
        batches it is next for, each up to its share."""
        ahead = self._ahead
        kept = ahead.buffer(batch_id)
        share = ahead.share()
        want = min(max(share, slice_), self._index.batches[batch_id].count)
        at_least = min(want, slice_)
        self._position(batch_id, share)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(kept) < want:
            if not self._unread:
                if time.monotonic() > deadline:
                    raise FeederError(f"{batch_id}: {len(kept)} of {want} records read back")
                self._fetch()
                continue
            m = self._unread[0]
            offset = offset_of(m)
            if offset >= self._index.frontier:
                break  # not scanned yet: the scan hands it out
            expected = ahead.expect(batch_id)
            if expected is not None and expected[0] - offset > GAP_SEEK:
                self._seek(expected[0])  # a long stretch of other batches' records: skip it
                continue
            if len(kept) >= at_least and not ahead.fits(size_of(m)):
                break  # its slice is kept and the budget is spent: the next sweep reads m
            owner = batch_of(headers_of(m))
            must = len(kept) < at_least
            if owner not in self._missed and not ahead.hand(
                owner, m, offset, batch_id, must, share, self._start
            ):
                if owner == batch_id:
                    break  # its slice is kept and the budget is spent: m is read next
                self._missed.add(owner)  # its later records are not its next in this sweep
            self._unread.popleft()
        if not kept and batch_id in self._index.batches:
            raise FeederError(f"{batch_id}: none of its records read back")
        return kept

    def _position(self, batch_id: str, share: int) -> None:
        """Have the sweep continue, or seek, so that it reads ``batch_id``'s next record;
        a new sweep starts at the earliest next record, within what the budget holds
        before it, of the batches holding less than ``share``, so that it serves them
        too instead of each seeking back alone."""
        ahead = self._ahead
        expected = ahead.expect(batch_id)
        assert expected is not None  # its buffer ran dry while records of it wait
        target = expected[0]
        at = offset_of(self._unread[0]) if self._unread else self._reader_at
        if (
            batch_id not in self._missed
            and at >= 0
            and self._start <= target <= at + GAP_SEEK
            and at <= target
        ):
            return
        back = int(ahead.budget_records())
        start = target
        for other in self._index.batches:
            if not ahead.short(other, share):
                continue
            found = ahead.expect(other)
            if found is not None and target - back <= found[0] < start:
                start = found[0]
        self._seek(start)

    def _fetch(self) -> None:
        for m in self._reader.consume(FETCH, timeout=0.1):
            error = m.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                continue
            self._unread.append(m)
            self._reader_at = offset_of(m) + 1
            self.reads += 1

    def _seek(self, offset: int) -> None:
        """Start a new sweep at ``offset``."""
        self._unread.clear()
        self._reader.assign([TopicPartition(self._topic, 0, offset)])
        self._reader_at = offset
        self._start = offset
        self._missed.clear()
        self.seeks += 1
