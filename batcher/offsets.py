"""Which Kafka offsets may be committed while requests finish out of order.

Requests of one partition are answered in any order (batches, dedup, retries), but a Kafka
commit means "everything before this offset is done". So the committable position of a
partition is its lowest unanswered offset, or one past the last offset when none is pending:
never past a request that still needs an answer, so a crash re-delivers it.

Answers are published as they complete, so records above the committable position may be
answered already when the partition changes hands. :class:`Progress` says which: what a
partition's owner writes with each commit (:meth:`OffsetTracker.progress`) and what its next
owner starts from (:meth:`OffsetTracker.inherit`), whose records it then skips.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from batcher.types import Partition


@dataclass(frozen=True)
class Progress:
    """Which records of one partition are answered, as of one commit.

    Invariants: every offset below ``committed`` is answered; between ``committed`` and
    ``highest`` (inclusive) every offset is answered except those in ``unanswered``
    (increasing, each in ``[committed, highest)``); nothing is said above ``highest``
    (``highest < committed``: nothing above ``committed``). Only answers already written
    may be counted answered: a reader skips them.
    """

    committed: int
    highest: int
    unanswered: tuple[int, ...] = ()
    _missing: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_missing", frozenset(self.unanswered))

    def answered(self, offset: int) -> bool:
        """Whether the record at ``offset`` is answered (a gap offset counts as answered:
        no record is ever read there)."""
        if offset < self.committed:
            return True
        return offset <= self.highest and offset not in self._missing


class _PartitionState:
    def __init__(self, first: int, inherited: Progress | None) -> None:
        self.order: deque[int] = deque()  # added offsets, increasing; answered head popped
        self.unanswered: set[int] = set()
        self.last_added = first - 1
        self.committed = first  # the broker's position is at most the first offset we saw
        self.highest = -1  # the highest offset answered here
        #: what an earlier owner answered, for the offsets not read here yet
        self.inherited = inherited

    def position(self) -> int:
        return self.order[0] if self.order else self.last_added + 1


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[Partition, _PartitionState] = {}
        self._inherited: dict[Partition, Progress] = {}

    def inherit(self, partition: Partition, progress: Progress) -> None:
        """An earlier owner's :class:`Progress` of ``partition``, before its first record
        is added here: records it counts answered are skipped (:meth:`add`)."""
        if partition in self._parts:
            raise ValueError(f"{partition} is tracked already: forget() it first")
        self._inherited[partition] = progress

    def add(self, partition: Partition, offset: int) -> bool:
        """Track a consumed offset; offsets of one partition must be added in increasing
        order (gaps are fine: compacted or transaction-marker offsets). False: an earlier
        owner answered it (:meth:`inherit`); it counts answered here and gets no answer."""
        state = self._parts.get(partition)
        if state is None:
            state = _PartitionState(offset, self._inherited.pop(partition, None))
            self._parts[partition] = state
        elif offset <= state.last_added:
            raise ValueError(
                f"{partition}: offset {offset} added after {state.last_added}; "
                "offsets must increase (forget() a partition before consuming it again)"
            )
        state.last_added = offset
        inherited = state.inherited
        if inherited is not None:
            if inherited.answered(offset):
                state.highest = max(state.highest, offset)
                if state.order:
                    state.order.append(offset)  # behind an unanswered one: popped with it
                if offset >= inherited.highest:
                    state.inherited = None
                return False
            if offset >= inherited.highest:
                state.inherited = None  # nothing more to skip
        state.order.append(offset)
        state.unanswered.add(offset)
        return True

    def done(self, partition: Partition, offset: int) -> None:
        """Mark an offset answered (any order); answering it twice is an error."""
        state = self._parts.get(partition)
        if state is None or offset not in state.unanswered:
            raise KeyError(f"{partition} offset {offset} is not pending")
        state.unanswered.remove(offset)
        state.highest = max(state.highest, offset)
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

    def progress(self, partition: Partition) -> Progress | None:
        """What a commit of :meth:`position` says of ``partition`` (None: not tracked):
        the offsets answered here and what was inherited and not read yet. Answered here
        means handed to the publisher; the caller writes this only with those answers."""
        state = self._parts.get(partition)
        if state is None:
            return self._inherited.get(partition)
        committed = state.position()
        inherited = state.inherited
        if inherited is not None and inherited.highest > state.last_added:
            # beyond what was read here, as the earlier owner said
            highest = inherited.highest
            missing = sorted(state.unanswered)
            missing.extend(o for o in inherited.unanswered if o > state.last_added)
        else:
            highest = max(state.highest, committed - 1)
            missing = sorted(o for o in state.unanswered if o < highest)
        return Progress(committed, highest, tuple(missing))

    def forget(self, partitions: Collection[Partition]) -> None:
        """Partitions revoked: their pending offsets will be re-delivered elsewhere."""
        for partition in partitions:
            self._parts.pop(partition, None)
            self._inherited.pop(partition, None)

    def pending(self, partition: Partition) -> int:
        """Unanswered offsets of ``partition``."""
        state = self._parts.get(partition)
        return len(state.unanswered) if state else 0

    def partitions(self) -> list[Partition]:
        return list(self._parts)
