"""Records read and not admitted yet: the worker's read-ahead.

A full worker reads past its ``prefetch_count`` slots on purpose, so that a record fed
while its engine runs is at hand when the engine frees slots (docs/architecture.md §2
"Backpressure"); every read goes through here before admission, and what the room does not
take stays. A record that ``poll()``/``consume()`` hands over has moved the consumer's
position past it: dropped, it would never be read again by this member, and once a later
offset of its partition is answered the commit would pass it — skipped for good. So nothing
the consumer returns is dropped: past the read-ahead too (a paused or draining worker's
``poll()`` serves rebalances and callbacks, and may still return a record fetched before a
pause), it is held here and fed to admission as room frees.

Which first. Within a partition, in offset order always (answers leave a partition in
offset order: admitting a later record first would not answer it sooner). Across
partitions, in read order, except that a record whose feeder tag (§10) is below the highest
tag held — a newly active batch's, fed behind what the worker had already fetched — goes
as if read ``window`` records earlier. librdkafka hands records over in the order it
fetched them, so a newcomer's first slice, fed to a partition of its own, came behind
everything fetched before it: at 20 ms a decoding step, the half second of reads the
feeder keeps in a fast worker's topic (``bench.fairness``).
The move is bounded as the batcher bounds a tag's (:mod:`batcher.batcher`): a record is
taken before any record read more than ``window`` after it, so a producer that writes low
tags on everything (anyone can write the requests topic) delays another record by at most
``window`` records, and records without a tag keep their read order.

A partition goes as early as its earliest held record (issue 50): the records ahead of a
moved one in its partition are taken with it, since they must leave first. Moved alone,
a priority batch's records (tag 0, batcher/tiers.py) waited behind its own first slice,
read when nothing lower was held and so not moved, while every later record of the
other tiers was: 30 of 50 waited 1.9 s. The bound holds: those records were read before
the one they go with, so none goes ahead of a record read more than ``window`` before it.

A held record is not opened in the :class:`~worker.loop.ledger.Ledger`, so no commit can pass
it: the group's committed offset stays at or below it until it is admitted and answered.
Records of partitions revoked, lost or rewound are let go: the partition is read again
from its committed offset, here or by its new owner.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping

from batcher import Partition
from worker.feeder.headers import Headers, headers_of, tag_of
from worker.kafka.consumer import Record


class HeldRecords:
    """Consumed records not admitted yet, taken in the order the module doc states.

    Invariants: every held record is in exactly one partition's queue, in offset (and
    read) order; ``_floors`` holds per queue the ascending minima of its places from each
    record on (its first: the queue's earliest place); ``_heads`` holds an entry per
    non-empty queue with that place (``_head``), and stale ones that :meth:`take` skips;
    ``_tags`` holds an entry for every held tagged record, so its top still held is the
    highest tag held (entries of records taken or let go leave it lazily: each such record
    was taken before any record read more than ``window`` after it, so they are few).
    """

    def __init__(self, window: int) -> None:
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self._window = window
        #: per partition, (place, read sequence, bytes, record) in offset order
        self._queues: dict[Partition, deque[tuple[int, int, int, Record]]] = {}
        self._heads: list[tuple[int, Partition]] = []  # (place, partition); stale too
        self._head: dict[Partition, int] = {}  # each non-empty queue's earliest place
        #: per partition, (place, read) of the records no later record is placed before
        self._floors: dict[Partition, deque[tuple[int, int]]] = {}
        self._tags: list[tuple[float, int, Partition]] = []  # (-tag, read sequence, ...)
        self._read = 0  # records held so far: each one's read sequence
        self._len = 0
        self.bytes = 0  # the held records' keys, values and headers, in all

    def __len__(self) -> int:
        return self._len

    def hold(self, records: Iterable[Record]) -> None:
        """Keep ``records`` (in read order) for :meth:`take`."""
        for record in records:
            headers = headers_of(record)
            tag = tag_of(headers)
            partition = _partition(record)
            read = self._read
            self._read += 1
            # twice the read sequence, so that a newcomer moved ``window`` places ahead
            # (one less) goes just before the record it is moved level with
            place = 2 * read
            if tag is not None:
                if tag < self._ceiling():
                    place -= 2 * self._window + 1  # behind what was fetched (module doc)
                heapq.heappush(self._tags, (-tag, read, partition))
            queue = self._queues.get(partition)
            if queue is None:
                queue = self._queues[partition] = deque()
                self._floors[partition] = deque()
            floors = self._floors[partition]
            while floors and floors[-1][0] >= place:
                floors.pop()
            floors.append((place, read))
            if place < self._head.get(partition, math.inf):  # the partition goes earlier
                self._head[partition] = place
                heapq.heappush(self._heads, (place, partition))
            size = _size(record, headers)
            queue.append((place, read, size, record))
            self._len += 1
            self.bytes += size

    def take(self, room: int) -> list[Record]:
        """Up to ``room`` held records, first first; no longer held."""
        taken: list[Record] = []
        heads, queues = self._heads, self._queues
        while heads and len(taken) < room:
            place, partition = heapq.heappop(heads)
            if self._head.get(partition) != place:
                continue  # stale: the partition was moved earlier, or let go
            queue, floors = queues[partition], self._floors[partition]
            _, read, size, record = queue.popleft()
            if floors[0][1] == read:
                floors.popleft()
            self.bytes -= size
            taken.append(record)
            if queue:
                self._head[partition] = floors[0][0]
                heapq.heappush(heads, (floors[0][0], partition))
            else:
                del self._head[partition]
        self._len -= len(taken)
        if not self._len:
            self._tags.clear()
        return taken

    def count(self, partition: Partition) -> int:
        """How many records of ``partition`` are held (safe from the lag probe's thread:
        one dictionary read and one deque length)."""
        queue = self._queues.get(partition)
        return 0 if queue is None else len(queue)

    def release(self, partitions: Collection[Partition]) -> int:
        """Let go of the records of ``partitions``; returns how many there were."""
        released = 0
        for partition in partitions:
            queue = self._queues.pop(partition, None)
            self._floors.pop(partition, None)
            self._head.pop(partition, None)
            if queue:
                released += len(queue)
                self.bytes -= sum(size for _, _, size, _ in queue)
        if released:
            self._heads = [(place, p) for p, place in self._head.items()]
            heapq.heapify(self._heads)
            self._len -= released
            if not self._len:
                self._tags.clear()
        return released

    def _ceiling(self) -> float:
        """The highest tag held; -inf when no tagged record is held."""
        tags, queues = self._tags, self._queues
        while tags:
            _, read, partition = tags[0]
            queue = queues.get(partition)
            if queue and queue[0][1] <= read:  # its partition's head has not passed it
                return -tags[0][0]
            heapq.heappop(tags)
        return -math.inf


def _size(record: Record, headers: Headers | None) -> int:
    """What a held record keeps in memory, near enough: key, value and headers."""
    key, value = record.key(), record.value()
    size = (0 if key is None else len(key)) + (0 if value is None else len(value))
    if headers:
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        size += sum(len(name) + (0 if v is None else len(v)) for name, v in pairs)
    return size


def _partition(record: Record) -> Partition:
    topic, number = record.topic(), record.partition()
    assert topic is not None and number is not None
    return topic, number
