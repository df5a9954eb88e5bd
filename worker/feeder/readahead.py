"""The records a feeder moves next, kept in memory within a byte budget: no seek per slice.

The scan reads every pending record once, in order, to index it (:mod:`worker.feeder.index`).
Of what it reads, each batch's next unfed records are kept here (at most
:data:`READ_AHEAD` a batch), so a slice is taken from memory. A batch whose kept records
ran out while more of it waits is *refilled* from Kafka.

*A refill is a sweep.* Publishers writing at once interleave their batches in the pending
partition (1,000 publishers in chunks of 20 records). Reading one batch back at a time
re-read every other batch's records between its own: 8,362 seeks and 42× the data to
feed 200k records (issue 38). A refill reads the partition sequentially from the
batch's cursor and hands *every* record it reads to the batch it belongs to, when that
record is the batch's next one not kept — so one sequential pass refills every batch
whose records it crosses, and the next refill continues where it stopped (records
fetched and not yet handed out wait in ``_unread``) instead of seeking.

*Memory is bounded by* :data:`READ_AHEAD_BYTES` *whatever the number of batches* (1,000
batches × 4,096 records × 4 KB held 15 GiB before: the budget was checked at the scan
only). Every record kept, by the scan or a refill, counts against it. A refill keeps at
least one slice of its own batch over the budget, evicting the least recently used other
batches' buffers first (LRU: a batch's buffer is used when it is taken from or refilled),
so the feeder always progresses and holds at most the budget plus one slice. A slice is
also capped at the budget's share of one active batch (:meth:`ReadAhead.slice_cap`), a
sweep keeps no more than that share of any other batch, and a new sweep starts at the
earliest next record of the batches short of their share (within what the budget
holds): a round of fair share over every active batch then fits the budget and one
sweep serves it, instead of each batch seeking back alone.

Invariants:

* a batch's kept records are consecutive unfed records of it in offset order, the first
  at its cursor; while ``whole`` they are all of its indexed unfed records, so a record
  the scan reads next can be appended;
* a refill appends a record to batch ``B`` only if it is ``B``'s next record not kept:
  ``_next[B]`` holds that offset and the number of the run it lies in, and a record read
  by the sweep qualifies when it lies in that run at or after that offset, the sweep
  began at or before it (so it read every offset between), and the sweep did not drop a
  record of that batch for want of room (``_missed``);
* taking a record marks it fed in the index, in order (the index refuses anything else);
* nothing is kept of a batch that has left the index.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import KafkaException, Message, TopicPartition

from worker.errors import BatchpipeError
from worker.feeder.headers import batch_of, headers_of
from worker.feeder.index import PendingIndex

#: the most records kept of one batch, and the most one refill reads for its batch
READ_AHEAD = 4096
#: the most bytes kept in all (keys and values), but for one slice of the batch refilled
READ_AHEAD_BYTES = 64 * 1024 * 1024
#: a refill seeks over a gap of other batches' records longer than this, else reads on
GAP_SEEK = 4096
#: records a refill fetches at a time
FETCH = 500
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


def _offset(m: Message) -> int:
    offset = m.offset()
    assert offset is not None
    return offset


class ReadAhead:
    def __init__(self, reader: Reader, topic: str, index: PendingIndex) -> None:
        self._reader = reader
        self._topic = topic
        self._index = index
        self._kept: dict[str, deque[Message]] = {}
        self._used: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._whole: set[str] = set()
        self._bytes = 0
        self._unread: deque[Message] = deque()  # fetched by the sweep, not handed out yet
        self._reader_at = -1  # the offset the reader fetches next; -1: not assigned
        self._sweep_start = 0  # where the current sweep began (its last seek)
        #: per batch, its next record not kept: (offset, number of its run); see _expect
        self._next: dict[str, tuple[int, int]] = {}
        self._missed: set[str] = set()  # batches this sweep read a record of but not kept
        self._seen = (0, 0)  # records the scan read, and their bytes: the mean record
        self.seeks = 0
        self.reads = 0  # records refills read (a measure of re-reading)
        self.peak_bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def slice_cap(self, active: int) -> int:
        """The most records one slice should take so that a slice of every one of
        ``active`` batches fits the budget together: then one sweep refills them all, and
        a round of fair share never has to read the partition twice (fairness is kept:
        a batch is charged what it was given)."""
        records, size = self._seen
        mean = size / records if records else 1.0
        return max(1, int(READ_AHEAD_BYTES / max(mean, 1.0) / max(active, 1)))

    def scanned(self, batch_id: str, m: Message, first: bool) -> None:
        """The scan indexed ``m`` as ``batch_id``'s newest unfed record (``first``: the
        batch was not in the index before it)."""
        size = _size(m)
        self._seen = (self._seen[0] + 1, self._seen[1] + size)
        if first:
            self.forget(batch_id)
            self._whole.add(batch_id)
        if batch_id not in self._whole:
            return
        kept = self._kept.setdefault(batch_id, deque())
        if len(kept) < READ_AHEAD and self._bytes + size <= READ_AHEAD_BYTES:
            self._keep(batch_id, kept, m)
            if first:
                self._touch(batch_id)
            return
        self._whole.discard(batch_id)  # from here on, a refill reads what is not kept
        batch = self._index.batches[batch_id]
        self._next[batch_id] = (_offset(m), batch.popped + len(batch.runs) - 1)

    def take(self, batch_id: str, count: int) -> list[Message]:
        """The next ``count`` records of ``batch_id`` (fewer when it has fewer), each marked
        fed in the index. A refill that fails raises, as :class:`PartialRead` when some
        records were taken before it."""
        taken: list[Message] = []
        self._touch(batch_id)
        while len(taken) < count and batch_id in self._index.batches:
            kept = self._kept.get(batch_id)
            if not kept:
                try:
                    kept = self._refill(batch_id, count - len(taken))
                except Exception as exc:
                    if taken:  # marked fed already: they must still be moved
                        raise PartialRead(taken, exc) from exc
                    raise
            m = kept.popleft()
            self._bytes -= _size(m)
            self._index.fed(batch_id, _offset(m))
            taken.append(m)
        if batch_id not in self._index.batches:
            self.forget(batch_id)
        return taken

    def forget(self, batch_id: str) -> None:
        for m in self._kept.pop(batch_id, ()):
            self._bytes -= _size(m)
        self._whole.discard(batch_id)
        self._used.pop(batch_id, None)
        self._next.pop(batch_id, None)

    def _keep(self, batch_id: str, kept: deque[Message], m: Message) -> None:
        kept.append(m)
        self._bytes += _size(m)
        self.peak_bytes = max(self.peak_bytes, self._bytes)

    def _touch(self, batch_id: str) -> None:
        self._used[batch_id] = None
        self._used.move_to_end(batch_id)

    def _evict(self, spare: str, size: int) -> None:
        """Drop least recently used buffers (never ``spare``'s) until ``size`` more bytes
        fit the budget, or nothing else is kept."""
        for batch_id in list(self._used):
            if self._bytes + size <= READ_AHEAD_BYTES:
                return
            if batch_id != spare and self._kept.get(batch_id):
                self.forget(batch_id)

    def _expect(self, batch_id: str) -> tuple[int, int] | None:
        """``batch_id``'s next record not kept — its offset (a lower bound: markers may
        lie between) and the number of its run — or None when every indexed one is."""
        found = self._next.get(batch_id)
        if found is not None:
            return found
        batch = self._index.batches[batch_id]
        kept = self._kept.get(batch_id)
        after = _offset(kept[-1]) + 1 if kept else batch.runs[0].start
        for i, run in enumerate(batch.runs):  # from its cursor: the kept runs at most
            if run.end > after:
                found = self._next[batch_id] = (max(after, run.start), batch.popped + i)
                return found
        return None

    def _advance(self, batch_id: str, offset: int, number: int) -> None:
        """``batch_id``'s record at ``offset``, in its run ``number``, was just kept."""
        batch = self._index.batches[batch_id]
        at = number - batch.popped
        if offset + 1 < batch.runs[at].end:
            self._next[batch_id] = (offset + 1, number)
        elif at + 1 < len(batch.runs):
            self._next[batch_id] = (batch.runs[at + 1].start, number + 1)
        else:
            self._next.pop(batch_id, None)
            self._whole.add(batch_id)  # every indexed record of it is kept

    def _refill(self, batch_id: str, slice_: int) -> deque[Message]:
        """Sweep the partition until ``batch_id`` has its share of the budget (at least
        ``slice_`` records, budget or not), handing what else the sweep reads to the
        batches it is next for, each up to its share."""
        kept = self._kept.setdefault(batch_id, deque())
        share = self._share()
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
            offset = _offset(m)
            if offset >= self._index.frontier:
                break  # not scanned yet: the scan hands it out
            expected = self._expect(batch_id)
            if expected is not None and expected[0] - offset > GAP_SEEK:
                self._seek(expected[0])  # a long stretch of other batches' records: skip it
                continue
            if len(kept) >= at_least and self._bytes + _size(m) > READ_AHEAD_BYTES:
                break  # its slice is kept and the budget is spent: the next sweep reads m
            owner = batch_of(headers_of(m))
            if not self._hand(owner, m, offset, batch_id, len(kept) < at_least, share):
                if owner == batch_id:
                    break  # its slice is kept and the budget is spent: m is read next
                self._missed.add(owner)  # its later records are not its next in this sweep
            self._unread.popleft()
        if not kept and batch_id in self._index.batches:
            raise FeederError(f"{batch_id}: none of its records read back")
        return kept

    def _hand(
        self, owner: str, m: Message, offset: int, refilled: str, must: bool, share: int
    ) -> bool:
        """Keep ``m`` for ``owner`` if it is that batch's next record not kept; False when
        it was not kept for want of room: the budget, or ``share`` records kept of a batch
        other than the one refilled (``must``: the refilled batch's slice, kept)."""
        batch = self._index.batches.get(owner)
        if batch is None or owner in self._whole or owner in self._missed:
            return True  # done with, every record of it kept (the scan appends), or missed
        expected = self._expect(owner)
        if expected is None:
            return True
        start, number = expected
        if not (self._sweep_start <= start <= offset < batch.runs[number - batch.popped].end):
            return True  # not its next (fed or kept, or one before it was not read)
        kept = self._kept.setdefault(owner, deque())
        size = _size(m)
        limit = READ_AHEAD if owner == refilled else share
        room = len(kept) < limit and self._bytes + size <= READ_AHEAD_BYTES
        if not room and owner == refilled and must:
            self._evict(owner, size)
            room = True
        if not room:
            return False
        self._keep(owner, kept, m)
        self._advance(owner, offset, number)
        if owner != refilled:
            self._touch(owner)
        return True

    def _share(self) -> int:
        """The records a sweep keeps of a batch other than the one it refills: the budget's
        share of one active batch, so one sweep serves a round of them all."""
        return min(READ_AHEAD, self.slice_cap(len(self._index.batches)))

    def _position(self, batch_id: str, share: int) -> None:
        """Have the sweep continue, or seek, so that it reads ``batch_id``'s next record;
        a new sweep starts at the earliest next record, within what the budget holds
        before it, of the batches holding less than ``share``, so that it serves them
        too instead of each seeking back alone."""
        expected = self._expect(batch_id)
        assert expected is not None  # its buffer ran dry while records of it wait
        target = expected[0]
        at = _offset(self._unread[0]) if self._unread else self._reader_at
        if (
            batch_id not in self._missed
            and at >= 0
            and self._sweep_start <= target <= at + GAP_SEEK
            and at <= target
        ):
            return
        records, size = self._seen
        back = int(READ_AHEAD_BYTES / max(size / records if records else 1.0, 1.0))
        start = target
        for other in self._index.batches:
            if other in self._whole or len(self._kept.get(other, ())) >= share:
                continue
            found = self._expect(other)
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
            self._reader_at = _offset(m) + 1
            self.reads += 1

    def _seek(self, offset: int) -> None:
        """Start a new sweep at ``offset``."""
        self._unread.clear()
        self._reader.assign([TopicPartition(self._topic, 0, offset)])
        self._reader_at = offset
        self._sweep_start = offset
        self._missed.clear()
        self.seeks += 1
