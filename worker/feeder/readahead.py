"""The records a feeder moves next, kept in memory within a byte budget: no seek per slice.

The scan reads every pending record once, in order, to index it (:mod:`worker.feeder.index`).
Of what it reads, each batch's next unfed records are kept here (at most
:data:`READ_AHEAD` a batch), so a slice is taken from memory. A batch whose kept records
ran out while more of it waits is *refilled* from Kafka.

*A refill is a sweep* (:mod:`worker.feeder.sweep`): one sequential read of the partition
from the batch's next record that offers every record it reads to the batch it belongs to
(:meth:`ReadAhead.hand`), so one pass refills every batch whose records it crosses.

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
  record of that batch for want of room (its *missed* batches, :mod:`worker.feeder.sweep`);
* taking a record marks it fed in the index, in order (the index refuses anything else);
* nothing is kept of a batch that has left the index.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from confluent_kafka import Message

from worker.feeder.index import PendingIndex
from worker.feeder.sweep import FeederError, Reader, Sweep, offset_of, size_of

#: the most records kept of one batch, and the most one refill reads for its batch
READ_AHEAD = 4096
#: the most bytes kept in all (keys and values), but for one slice of the batch refilled
READ_AHEAD_BYTES = 64 * 1024 * 1024


class PartialRead(FeederError):
    """A take that failed after ``taken`` were marked fed: the caller moves them."""

    def __init__(self, taken: list[Message], cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.taken = taken


class ReadAhead:
    def __init__(self, reader: Reader, topic: str, index: PendingIndex) -> None:
        self._index = index
        self._kept: dict[str, deque[Message]] = {}
        self._used: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._whole: set[str] = set()
        self._bytes = 0
        #: per batch, its next record not kept: (offset, number of its run); see expect
        self._next: dict[str, tuple[int, int]] = {}
        self._seen = (0, 0)  # records the scan read, and their bytes: the mean record
        self.peak_bytes = 0
        self._sweep = Sweep(reader, topic, index, self)

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    @property
    def seeks(self) -> int:
        return self._sweep.seeks

    @property
    def reads(self) -> int:
        """Records refills read (a measure of re-reading)."""
        return self._sweep.reads

    def budget_records(self) -> float:
        """How many records of the mean size the scan has seen fit the budget."""
        records, size = self._seen
        mean = size / records if records else 1.0
        return READ_AHEAD_BYTES / max(mean, 1.0)

    def slice_cap(self, active: int) -> int:
        """The most records one slice should take so that a slice of every one of
        ``active`` batches fits the budget together: then one sweep refills them all, and
        a round of fair share never has to read the partition twice (fairness is kept:
        a batch is charged what it was given)."""
        return max(1, int(self.budget_records() / max(active, 1)))

    def scanned(self, batch_id: str, m: Message, first: bool) -> None:
        """The scan indexed ``m`` as ``batch_id``'s newest unfed record (``first``: the
        batch was not in the index before it)."""
        size = size_of(m)
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
        self._next[batch_id] = (offset_of(m), batch.popped + len(batch.runs) - 1)

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
                    kept = self._sweep.refill(batch_id, count - len(taken))
                except Exception as exc:
                    if taken:  # marked fed already: they must still be moved
                        raise PartialRead(taken, exc) from exc
                    raise
            m = kept.popleft()
            self._bytes -= size_of(m)
            self._index.fed(batch_id, offset_of(m))
            taken.append(m)
        if batch_id not in self._index.batches:
            self.forget(batch_id)
        return taken

    def forget(self, batch_id: str) -> None:
        for m in self._kept.pop(batch_id, ()):
            self._bytes -= size_of(m)
        self._whole.discard(batch_id)
        self._used.pop(batch_id, None)
        self._next.pop(batch_id, None)

    def _keep(self, batch_id: str, kept: deque[Message], m: Message) -> None:
        kept.append(m)
        self._bytes += size_of(m)
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

    def expect(self, batch_id: str) -> tuple[int, int] | None:
        """``batch_id``'s next record not kept — its offset (a lower bound: markers may
        lie between) and the number of its run — or None when every indexed one is."""
        found = self._next.get(batch_id)
        if found is not None:
            return found
        batch = self._index.batches[batch_id]
        kept = self._kept.get(batch_id)
        after = offset_of(kept[-1]) + 1 if kept else batch.runs[0].start
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

    def buffer(self, batch_id: str) -> deque[Message]:
        """``batch_id``'s kept records (a refill appends to them)."""
        return self._kept.setdefault(batch_id, deque())

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes fit the budget."""
        return self._bytes + size <= READ_AHEAD_BYTES

    def short(self, batch_id: str, share: int) -> bool:
        """Whether ``batch_id`` holds fewer than ``share`` kept records and more of it
        waits to be read back."""
        return batch_id not in self._whole and len(self._kept.get(batch_id, ())) < share

    def hand(
        self,
        owner: str,
        m: Message,
        offset: int,
        refilled: str,
        must: bool,
        share: int,
        since: int,
    ) -> bool:
        """Keep ``m``, read by a sweep that began at ``since``, for ``owner`` if it is that
        batch's next record not kept; False when it was not kept for want of room: the
        budget, or ``share`` records kept of a batch other than the one refilled
        (``must``: the refilled batch's slice, kept)."""
        batch = self._index.batches.get(owner)
        if batch is None or owner in self._whole:
            return True  # done with, or every record of it kept (the scan appends)
        expected = self.expect(owner)
        if expected is None:
            return True
        start, number = expected
        if not (since <= start <= offset < batch.runs[number - batch.popped].end):
            return True  # not its next (fed or kept, or one before it was not read)
        kept = self._kept.setdefault(owner, deque())
        size = size_of(m)
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

    def share(self) -> int:
        """The records a sweep keeps of a batch other than the one it refills: the budget's
        share of one active batch, so one sweep serves a round of them all."""
        return min(READ_AHEAD, self.slice_cap(len(self._index.batches)))
