"""Answers waiting for the next transaction.

An answer goes into the first transaction handed over after it was given, whatever is
still unanswered ahead of it in its partition: the transaction's progress records
(:mod:`worker.kafka.progress`) tell the partition's next owner which records above the
committed offset are answered already. Answers still waiting when their partition is
revoked, lost or rewound are dropped: the next consumer of the partition answers them.

The buffer is bounded by the loop (:meth:`AnswerBuffer.full`): admission takes no new
record while it holds ``kafka.max_buffered_answers`` answers or ``kafka.max_buffered_bytes``
bytes — answers given while a slow commit runs — so a slow commit pushes back on the
broker instead of growing memory. Every handover empties it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from batcher import Partition
from worker.kafka.publisher import Outgoing


@dataclass(frozen=True)
class BufferLimits:
    """When admission pauses: at ``answers`` answers or ``bytes`` bytes buffered."""

    answers: int
    bytes: int


class AnswerBuffer:
    """Answers given and not handed to a transaction yet, in the order they were given."""

    def __init__(self, limits: BufferLimits) -> None:
        self._limits = limits
        # (input partition, the record's size, the record)
        self._waiting: list[tuple[Partition, int, Outgoing]] = []
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def bytes(self) -> int:
        return self._bytes

    def full(self) -> bool:
        """At a bound: take no new record until a handover takes what waits."""
        return len(self._waiting) >= self._limits.answers or self._bytes >= self._limits.bytes

    def add(self, origin: Partition, size: int, record: Outgoing) -> None:
        """An answer to a record of ``origin``, of ``size`` bytes."""
        self._waiting.append((origin, size, record))
        self._bytes += size

    def take(self) -> list[tuple[Partition, Outgoing]]:
        """Every answer waiting, in the order given; the buffer is empty after."""
        waiting, self._waiting, self._bytes = self._waiting, [], 0
        return [(origin, record) for origin, _, record in waiting]

    def forget(self, partitions: Collection[Partition]) -> None:
        """Drop the answers to records of ``partitions`` (their records are consumed again)."""
        gone = set(partitions)
        if not gone or not self._waiting:
            return
        self._waiting = [entry for entry in self._waiting if entry[0] not in gone]
        self._bytes = sum(entry[1] for entry in self._waiting)
