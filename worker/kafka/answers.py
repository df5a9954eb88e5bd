"""Answers waiting for their transaction, each held until its offset can be committed with it.

A Kafka commit says "everything below this offset is answered", and the committable
position of a partition stops at its lowest unanswered record (:class:`batcher.OffsetTracker`).
An answer to a record beyond that position, published now, would be on the results topic
while its offset is not committed: a revoke hands the partition over at the position, the
next owner consumes that record again and answers it a second time (issue 40: 74 of 600
ids answered twice across clean rebalances). So an answer is released to a transaction
only once its partition's committable position has passed its offset — the same
transaction then carries that position — and answers still held when their partition is
revoked, lost or rewound are dropped: the next consumer of the partition answers them.

The buffer is bounded by the loop (:meth:`AnswerBuffer.full`): admission takes no new
record while it holds ``kafka.max_buffered_answers`` answers or ``kafka.max_buffered_bytes``
bytes, so a long straggler or a slow commit pushes back on the broker instead of
growing memory. What it holds always drains: the straggler is admitted already, so it runs
and completes, and a commit follows within ``kafka.commit_interval_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from batcher import Partition
from worker.kafka.publisher import Outgoing

#: where a partition's committable position is now (None: the partition is not tracked)
Positions = Callable[[Partition], int | None]


@dataclass(frozen=True)
class BufferLimits:
    """When admission pauses: at ``answers`` answers or ``bytes`` bytes buffered."""

    answers: int
    bytes: int


class AnswerBuffer:
    """Answers given and not handed to a transaction yet, in the order they were given."""

    def __init__(self, limits: BufferLimits) -> None:
        self._limits = limits
        # (input partition, its record's offset or None, the record's size, the record)
        self._waiting: list[tuple[Partition, int | None, int, Outgoing]] = []
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def bytes(self) -> int:
        return self._bytes

    def full(self) -> bool:
        """At a bound: take no new record until a commit releases some."""
        return len(self._waiting) >= self._limits.answers or self._bytes >= self._limits.bytes

    def add(self, origin: Partition, offset: int | None, size: int, record: Outgoing) -> None:
        """An answer to the record at ``offset`` of ``origin`` (None: release it with the
        next transaction whatever the position, for a caller that tracks no offsets)."""
        self._waiting.append((origin, offset, size, record))
        self._bytes += size

    def release(self, positions: Positions) -> list[tuple[Partition, Outgoing]]:
        """The answers whose offsets are below their partition's committable position now,
        no longer held; the others stay, in order."""
        ready: list[tuple[Partition, Outgoing]] = []
        held: list[tuple[Partition, int | None, int, Outgoing]] = []
        known: dict[Partition, int | None] = {}
        for entry in self._waiting:
            origin, offset = entry[0], entry[1]
            if offset is not None:
                if origin not in known:
                    known[origin] = positions(origin)
                position = known[origin]
                if position is None or offset >= position:
                    held.append(entry)
                    continue
            ready.append((origin, entry[3]))
        self._waiting = held
        self._bytes = sum(entry[2] for entry in held)
        return ready

    def held(self, partition: Partition) -> int:
        """How many answers to records of ``partition`` wait."""
        return sum(1 for entry in self._waiting if entry[0] == partition)

    def forget(self, partitions: Collection[Partition]) -> None:
        """Drop the answers to records of ``partitions`` (their records are consumed again)."""
        gone = set(partitions)
        if not gone or not self._waiting:
            return
        kept = [entry for entry in self._waiting if entry[0] not in gone]
        self._bytes -= sum(entry[2] for entry in self._waiting if entry[0] in gone)
        self._waiting = kept
