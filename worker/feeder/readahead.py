"""The records a feeder moves next, kept from the index scan: no seek per slice.

The scan reads every pending record once, in order, to index it (:mod:`worker.feeder.index`).
Of what it reads, each batch's next unfed records are kept here (at most
:data:`READ_AHEAD` a batch and :data:`READ_AHEAD_BYTES` in all), so a slice is taken from
memory. A batch whose kept records ran out while more of it waits (its backlog is longer
than what is kept) is *refilled*: one seek to its cursor and one sequential read of up to
:data:`READ_AHEAD` of its records — a seek per thousands of records, not per slice.

Invariants:

* a batch's kept records are consecutive unfed records of it in offset order, the first
  at its cursor; while ``whole`` they are all of its indexed unfed records, so a record
  the scan reads next can be appended;
* taking a record marks it fed in the index, in order (the index refuses anything else);
* nothing is kept of a batch that has left the index.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaException, Message, TopicPartition

from worker.errors import BatchpipeError
from worker.feeder.index import PendingIndex

#: the most records kept of one batch, and the most one refill reads
READ_AHEAD = 4096
#: the most bytes kept in all (keys and values)
READ_AHEAD_BYTES = 64 * 1024 * 1024
#: a refill seeks over a gap of other batches' records longer than this, else reads on
GAP_SEEK = 4096
READ_TIMEOUT_S = 30.0


class FeederError(BatchpipeError, RuntimeError):
    """The mover cannot go on (a slice could not be read back); build a new one."""


class PartialRead(FeederError):
    """A take that failed after ``taken`` were marked fed: the caller moves them."""

    def __init__(self, taken: list[Message], cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.taken = taken


class Reader(Protocol):
    """The consumer a refill reads with: assigned by hand, never subscribed."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[Message]: ...


def _size(m: Message) -> int:
    return len(m.value() or b"") + len(m.key() or b"")


class ReadAhead:
    def __init__(self, reader: Reader, topic: str, index: PendingIndex) -> None:
        self._reader = reader
        self._topic = topic
        self._index = index
        self._kept: dict[str, deque[Message]] = {}
        self._whole: set[str] = set()
        self._bytes = 0
        self._reader_at = -1  # the offset the reader reads next; -1: not assigned
        self.seeks = 0

    def scanned(self, batch_id: str, m: Message, first: bool) -> None:
        """The scan indexed ``m`` as ``batch_id``'s newest unfed record (``first``: the
        batch was not in the index before it)."""
        if first:
            self.forget(batch_id)
            self._whole.add(batch_id)
        kept = self._kept.setdefault(batch_id, deque())
        fits = len(kept) < READ_AHEAD and self._bytes + _size(m) <= READ_AHEAD_BYTES
        if batch_id in self._whole and fits:
            kept.append(m)
            self._bytes += _size(m)
            return
        self._whole.discard(batch_id)  # from here on, a refill reads what is not kept

    def take(self, batch_id: str, count: int) -> list[Message]:
        """The next ``count`` records of ``batch_id`` (fewer when it has fewer), each marked
        fed in the index. A refill that fails raises, as :class:`PartialRead` when some
        records were taken before it."""
        taken: list[Message] = []
        while len(taken) < count and batch_id in self._index.batches:
            kept = self._kept.get(batch_id)
            if not kept:
                try:
                    kept = self._kept[batch_id] = self._refill(batch_id)
                except Exception as exc:
                    if taken:  # marked fed already: they must still be moved
                        raise PartialRead(taken, exc) from exc
                    raise
            m = kept.popleft()
            self._bytes -= _size(m)
            offset = m.offset()
            assert offset is not None
            self._index.fed(batch_id, offset)
            taken.append(m)
        if batch_id not in self._index.batches:
            self.forget(batch_id)
        return taken

    def forget(self, batch_id: str) -> None:
        for m in self._kept.pop(batch_id, ()):
            self._bytes -= _size(m)
        self._whole.discard(batch_id)

    def _refill(self, batch_id: str) -> deque[Message]:
        """Up to :data:`READ_AHEAD` of ``batch_id``'s next unfed records, read in one pass."""
        runs = list(self._index.batches[batch_id].runs)
        want = min(READ_AHEAD, sum(run.count for run in runs))
        kept: deque[Message] = deque()
        at = 0  # the run being read
        self._seek(runs[0].start)
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(kept) < want:
            if time.monotonic() > deadline:
                raise FeederError(f"{batch_id}: {len(kept)} of {want} records read back")
            for m in self._reader.consume(min(1000, want - len(kept) + GAP_SEEK), timeout=0.1):
                error = m.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                offset = m.offset()
                assert offset is not None
                self._reader_at = offset + 1
                while at < len(runs) and offset >= runs[at].end:
                    at += 1
                if at == len(runs) or len(kept) == want:
                    self._reader_at = -1  # the rest of this fetch is dropped: unknown
                    break
                if offset < runs[at].start:
                    if runs[at].start - offset > GAP_SEEK:
                        self._seek(runs[at].start)
                        break
                    continue  # another batch's record between two runs
                kept.append(m)
                self._bytes += _size(m)
        self._whole.discard(batch_id)
        if len(kept) == sum(run.count for run in runs):
            self._whole.add(batch_id)  # all of it: what the scan reads next may follow
        return kept

    def _seek(self, offset: int) -> None:
        if self._reader_at != offset:
            self._reader.assign([TopicPartition(self._topic, 0, offset)])
            self._reader_at = offset
            self.seeks += 1
