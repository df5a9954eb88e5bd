"""The records a worker holds: consumed, not yet answered.

Each consumed record is opened once and closed once, when its answer counts as given;
only then may its offset be committed (:class:`batcher.OffsetTracker`). Its
``prefetch_count`` slot (:class:`batcher.Admission`) is freed then, or earlier, once the
publisher holds its answer (:meth:`Ledger.free`: at-least-once holds an answer until the
broker acknowledges it, bounded by ``kafka.max_buffered_*`` rather than by the slots).
Records of a partition that moved to another worker are forgotten: their new owner
answers them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from batcher import Admission, OffsetTracker, Partition
from worker.loop.jobs import Source


class Ledger:
    def __init__(self, prefetch_count: int) -> None:
        self.admission = Admission(prefetch_count)
        self.tracker = OffsetTracker()
        # offset → whether the record still holds its slot
        self._open: defaultdict[Partition, dict[int, bool]] = defaultdict(dict)
        #: counts :meth:`forget` calls; a record read again after its partition was
        #: forgotten is read in a later generation (see :attr:`worker.loop.jobs.Source.ref`)
        self.generation = 0

    def __len__(self) -> int:
        return self.admission.inflight

    def open(self, source: Source) -> bool:
        """A record was consumed: it holds a slot until it is answered or forgotten. False:
        an earlier owner of its partition answered it (:meth:`OffsetTracker.inherit`); it
        counts answered, holds nothing and must not be answered again."""
        partition = (source.topic, source.partition)
        if not self.tracker.add(partition, source.offset):
            return False
        self.admission.acquire()
        self._open[partition][source.offset] = True
        return True

    def close(self, source: Source) -> bool:
        """Its answer counts as given; False if the record was forgotten meanwhile."""
        partition = (source.topic, source.partition)
        offsets = self._open.get(partition)
        if offsets is None or source.offset not in offsets:
            return False
        if offsets.pop(source.offset):
            self.admission.release()
        self.tracker.done(partition, source.offset)
        return True

    def free(self, source: Source) -> None:
        """The publisher holds the record's answer: its slot is free, the record stays
        open (its offset is not committable) until :meth:`close`."""
        offsets = self._open.get((source.topic, source.partition))
        if offsets is not None and offsets.get(source.offset):
            offsets[source.offset] = False
            self.admission.release()

    def forget(self, partitions: Collection[Partition]) -> None:
        """The partitions went to another worker (or back to their committed offsets)."""
        for partition in partitions:
            held = self._open.pop(partition, {})
            self.admission.release(sum(held.values()))
        self.tracker.forget(partitions)
        self.generation += 1
