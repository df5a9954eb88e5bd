"""Which Kafka offsets may be committed while requests finish out of order.

Requests of one partition are answered in any order (batches, dedup, retries), but a Kafka
commit means "everything before this offset is done". So the committable position of a
partition is its lowest unanswered offset, or one past the last offset when none is pending:
never past a request that still needs an answer, so a crash re-delivers it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

from batcher.types import Partition


class _PartitionState:
    def __init__(self, first: int) -> None:
        self.order: deque[int] = deque()  # added offsets, increasing; answered head popped
        self.unanswered: set[int] = set()
        self.last_added = first - 1
        self.committed = first  # the broker's position is at most the first offset we saw

    def position(self) -> int:
        return self.order[0] if self.order else self.last_added + 1


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[Partition, _PartitionState] = {}

    def add(self, partition: Partition, offset: int) -> None:
        """Track a consumed offset; offsets of one partition must be added in increasing
        order (gaps are fine: compacted or transaction-marker offsets)."""
        state = self._parts.get(partition)
        if state is None:
            state = self._parts[partition] = _PartitionState(offset)
        elif offset <= state.last_added:
            raise ValueError(
                f"{partition}: offset {offset} added after {state.last_added}; "
                "offsets must increase (forget() a partition before consuming it again)"
            )
        state.order.append(offset)
        state.unanswered.add(offset)
        state.last_added = offset

    def done(self, partition: Partition, offset: int) -> None:
        """Mark an offset answered (any order); answering it twice is an error."""
        state = self._parts.get(partition)
        if state is None or offset not in state.unanswered:
            raise KeyError(f"{partition} offset {offset} is not pending")
        state.unanswered.remove(offset)
        while state.order and state.order[0] not in state.unanswered:
            state.order.popleft()

    def committable(self) -> dict[Partition, int]:
        """Per partition that advanced since the last commit: the next offset to commit
        (Kafka's convention: the offset of the next message to consume)."""
        result: dict[Partition, int] = {}
        for partition, state in self._parts.items():
            position = state.position()
            if position > state.committed:
                result[partition] = position
        return result

    def advanced(self) -> bool:
        """Whether some partition has answered offsets its last commit did not cover."""
        return any(s.position() > s.committed for s in self._parts.values())

    def mark_committed(self, offsets: Mapping[Partition, int]) -> None:
        """Record a successful commit; partitions forgotten meanwhile are ignored."""
        for partition, offset in offsets.items():
            state = self._parts.get(partition)
            if state is not None:
                state.committed = max(state.committed, offset)

    def position(self, partition: Partition) -> int | None:
        """Where ``partition`` could be committed now (its lowest unanswered offset, or one
        past the last one added); None for a partition not tracked."""
        state = self._parts.get(partition)
        return state.position() if state else None

    def committed(self, partition: Partition) -> int | None:
        """The last offset committed for ``partition`` (at first, the first offset seen:
        the broker's position was at most that); None for a partition not tracked."""
        state = self._parts.get(partition)
        return state.committed if state else None

    def forget(self, partitions: Collection[Partition]) -> None:
        """Partitions revoked: their pending offsets will be re-delivered elsewhere."""
        for partition in partitions:
            self._parts.pop(partition, None)

    def pending(self, partition: Partition) -> int:
        """Unanswered offsets of ``partition``."""
        state = self._parts.get(partition)
        return len(state.unanswered) if state else 0

    def partitions(self) -> list[Partition]:
        return list(self._parts)
