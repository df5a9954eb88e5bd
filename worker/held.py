"""Records read and not admitted yet: the worker's read-ahead.

A full worker reads up to one engine batch past its ``prefetch_count`` slots on purpose,
so that a record fed while its engine runs is at hand when the engine frees slots
(docs/architecture.md §2 "Backpressure"); every read goes through here before admission,
and what the room does not take stays. A record that ``poll()``/``consume()`` hands over
has moved the consumer's position past it: dropped, it would never be read again by this
member, and once a later offset of its partition is answered the commit would pass it —
skipped for good. So nothing the consumer returns is dropped: past the read-ahead too (a
paused or draining worker's ``poll()`` serves rebalances and callbacks, and may still
return a record fetched before a pause), it is held here, in the order it was read, and
fed to admission before anything newer as room frees.

A held record is not opened in the :class:`~worker.ledger.Ledger`, so no commit can pass
it: the group's committed offset stays at or below it until it is admitted and answered.
Records of partitions revoked, lost or rewound are let go: the partition is read again
from its committed offset, here or by its new owner.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable

from batcher import Partition
from worker.kafka.consumer import Record


class HeldRecords:
    """A FIFO of consumed records not admitted yet."""

    def __init__(self) -> None:
        self._records: deque[Record] = deque()
        # kept per partition so that :meth:`count` never walks the deque: the lag probe
        # calls it from its own thread while the loop changes the records
        self._counts: Counter[Partition] = Counter()

    def __len__(self) -> int:
        return len(self._records)

    def hold(self, records: Iterable[Record]) -> None:
        """Keep ``records`` (in read order) for :meth:`take`."""
        for record in records:
            self._records.append(record)
            self._counts[_partition(record)] += 1

    def take(self, room: int) -> list[Record]:
        """The oldest ``room`` held records, no longer held."""
        taken: list[Record] = []
        while self._records and len(taken) < room:
            record = self._records.popleft()
            self._counts[_partition(record)] -= 1
            taken.append(record)
        return taken

    def count(self, partition: Partition) -> int:
        """How many records of ``partition`` are held."""
        return self._counts.get(partition, 0)

    def release(self, partitions: Collection[Partition]) -> int:
        """Let go of the records of ``partitions``; returns how many there were."""
        moved = set(partitions)
        kept = [r for r in self._records if _partition(r) not in moved]
        released = len(self._records) - len(kept)
        self._records = deque(kept)
        for partition in moved:
            self._counts.pop(partition, None)
        return released


def _partition(record: Record) -> Partition:
    topic, number = record.topic(), record.partition()
    assert topic is not None and number is not None
    return topic, number
