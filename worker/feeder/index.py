"""Where each batch's unfed requests lie in the pending partition: the feeder's index.

The pending partition is scanned once, in order. Each record is noted against its batch
(the ``batch-id`` header) as part of a *run*: consecutive records of one batch, with no
record of another batch between them (offsets may skip transaction markers). A batch that
``submit`` wrote in one transaction is one run, unless another batch was written at the
same moment. Feeding takes a batch's records in offset order, so what of a batch was fed
is exactly its records below its *cursor* (``fed_to``): that one number per batch,
written to the feeder's state topic with each slice, lets a new feeder skip what was fed.

Invariants:

* a batch's runs are disjoint, increasing and hold only that batch's records;
* ``low_water()`` is at or below every unfed record: the pending partition's committed
  offset never passes a request that still has to be fed;
* what is kept is a few numbers per run and per batch, never a record's body.

Pure logic: no Kafka here (:mod:`worker.feeder.feeder` reads and writes).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Run:
    """Records of one batch at offsets ``[start, end)``: ``count`` of them (markers skipped)."""

    start: int
    end: int
    count: int


@dataclass(slots=True)
class PendingBatch:
    batch_id: str
    weight: float
    runs: deque[Run] = field(default_factory=deque)
    count: int = 0  # its unfed records: the sum of its runs' counts
    popped: int = 0  # runs fed whole and gone: a run's number is popped + its position


#: the most runs and active batches indexed: past either, the scan pauses until feeding
#: frees some (a run costs about 120 bytes, a batch with its share about 600: together
#: at most about 180 MiB whatever publishers write; 1,000 batches of 10,000 records in
#: chunks of 20 are 500,000 runs)
MAX_RUNS = 1_000_000
MAX_BATCHES = 100_000


class PendingIndex:
    """The unfed records of every batch, and what was fed (``fed_to``) per batch."""

    def __init__(self, fed_to: dict[str, int] | None = None, start: int = 0) -> None:
        self.batches: dict[str, PendingBatch] = {}
        #: per batch: every record of it below this offset was fed (its state record)
        self.fed_to: dict[str, int] = dict(fed_to or {})
        #: per batch fully fed as far as scanned: the offset after its last record
        self.finished: dict[str, int] = {}
        self._finished_order: list[tuple[int, str]] = []  # (end, batch id); stale ones too
        self.frontier = start  # the next offset to scan
        self.runs = 0  # runs indexed, over every batch
        self._last_batch: str | None = None  # the batch of the record scanned last
        # a takeover: a batch fed up to or below where this index starts has no record
        # this feeder will scan, so it is finished and its state goes at the first commit
        # (before issue 38 such entries piled up in the state topic with every takeover)
        for batch_id, end in self.fed_to.items():
            if end <= start:
                self._finish(batch_id, end)

    def scan(self, offset: int, batch_id: str, weight: float) -> bool:
        """Note the record at ``offset`` (offsets increase); False when it was fed already."""
        self.frontier = offset + 1
        fed_to = self.fed_to.get(batch_id, 0)
        if offset < fed_to:
            self._last_batch = None  # a fed record ends any run
            if batch_id not in self.batches and batch_id not in self.finished:
                # fed to its end by an earlier feeder that stopped before retiring it:
                # finished here, so its state is retired (tombstoned) by this one
                self._finish(batch_id, fed_to)
            return False
        batch = self.batches.get(batch_id)
        if batch is None:
            batch = self.batches[batch_id] = PendingBatch(batch_id, weight)
            self.finished.pop(batch_id, None)
        if self._last_batch == batch_id and batch.runs:
            run = batch.runs[-1]
            run.end, run.count = offset + 1, run.count + 1
        else:
            batch.runs.append(Run(offset, offset + 1, 1))
            self.runs += 1
        batch.count += 1
        self._last_batch = batch_id
        return True

    def skip(self, offset: int) -> None:
        """The record at ``offset`` is no request (a batch's end marker): passed over."""
        self.frontier = offset + 1
        self._last_batch = None

    @property
    def full(self) -> bool:
        """Whether the scan should pause: the index holds :data:`MAX_RUNS` runs or
        :data:`MAX_BATCHES` active batches (hostile or pathological layouts: a record
        per batch, or publishers interleaved a record at a time)."""
        return self.runs >= MAX_RUNS or len(self.batches) >= MAX_BATCHES

    def cursor(self, batch_id: str) -> int:
        """The offset of ``batch_id``'s next unfed record."""
        return self.batches[batch_id].runs[0].start

    def fed(self, batch_id: str, offset: int) -> None:
        """The record of ``batch_id`` at ``offset`` (its next unfed one) was fed."""
        batch = self.batches[batch_id]
        run = batch.runs[0]
        if not run.start <= offset < run.end:
            raise ValueError(f"{batch_id}: fed {offset}, but its next run is {run}")
        run.start, run.count = offset + 1, run.count - 1
        batch.count -= 1
        self.fed_to[batch_id] = offset + 1
        if run.count == 0:
            batch.runs.popleft()
            batch.popped += 1
            self.runs -= 1
            if batch.runs:
                self.fed_to[batch_id] = batch.runs[0].start
        if not batch.runs:
            del self.batches[batch_id]
            self._finish(batch_id, self.fed_to[batch_id])
            if self._last_batch == batch_id:
                self._last_batch = None

    def abandon(self, batch_id: str) -> int:
        """Mark every indexed record of ``batch_id`` fed without moving it (records that
        cannot be read back); returns how many."""
        batch = self.batches.get(batch_id)
        if batch is None:
            return 0
        count = batch.count
        self.runs -= len(batch.runs) - 1
        last = batch.runs[-1]
        self.batches[batch_id] = PendingBatch(batch_id, batch.weight, deque([last]), 1)
        last.start, last.count = last.end - 1, 1
        self.fed(batch_id, last.start)  # the bookkeeping of a batch fed to its end
        return count

    def _finish(self, batch_id: str, end: int) -> None:
        self.finished[batch_id] = end
        heapq.heappush(self._finished_order, (end, batch_id))

    def low_water(self) -> int:
        """The lowest offset still to be fed, or the frontier when everything scanned is."""
        starts = [b.runs[0].start for b in self.batches.values()]
        return min(starts, default=self.frontier)

    def retire(self, committed: int) -> list[str]:
        """Batches whose every record lies below ``committed`` (the pending partition's new
        committed offset): a new feeder will never scan them, so their state can go. Costs
        O(log n) a batch retired, not a walk over every finished batch."""
        gone: list[str] = []
        order = self._finished_order
        while order and order[0][0] <= committed:
            end, batch_id = heapq.heappop(order)
            if self.finished.get(batch_id) == end:  # else: active again, or retired
                del self.finished[batch_id]
                self.fed_to.pop(batch_id, None)
                gone.append(batch_id)
        return gone
