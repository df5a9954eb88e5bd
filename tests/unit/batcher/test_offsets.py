"""OffsetTracker: the committable offset never passes an unanswered request."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from batcher import OffsetTracker

P0 = ("requests", 0)
P1 = ("requests", 1)


def test_commits_up_to_the_lowest_unanswered_offset() -> None:
    t = OffsetTracker()
    for offset in (10, 11, 12, 15):
        t.add(P0, offset)
    assert t.committable() == {}  # nothing answered: nothing advanced
    t.done(P0, 11)
    t.done(P0, 12)
    assert t.committable() == {}  # 10 still pending
    t.done(P0, 10)
    assert t.committable() == {P0: 15}
    assert t.pending(P0) == 1
    t.done(P0, 15)
    assert t.committable() == {P0: 16}  # Kafka convention: the next offset to consume
    assert t.pending(P0) == 0


def test_only_partitions_that_advanced_since_the_last_commit() -> None:
    t = OffsetTracker()
    t.add(P0, 0)
    t.add(P1, 7)
    t.done(P0, 0)
    assert t.committable() == {P0: 1}
    t.mark_committed({P0: 1})
    assert t.committable() == {}
    t.add(P0, 1)
    t.done(P1, 7)
    assert t.committable() == {P1: 8}
    t.done(P0, 1)
    assert t.committable() == {P0: 2, P1: 8}


def test_offsets_must_increase_and_be_answered_once() -> None:
    t = OffsetTracker()
    t.add(P0, 5)
    with pytest.raises(ValueError):
        t.add(P0, 5)
    with pytest.raises(KeyError):
        t.done(P0, 4)
    t.done(P0, 5)
    with pytest.raises(KeyError):
        t.done(P0, 5)
    with pytest.raises(KeyError):
        t.done(P1, 0)


def test_forget_drops_a_revoked_partition() -> None:
    t = OffsetTracker()
    t.add(P0, 5)
    t.add(P0, 6)
    t.done(P0, 5)
    t.forget([P0])
    assert t.committable() == {} and t.pending(P0) == 0 and t.partitions() == []
    t.mark_committed({P0: 9})  # a commit that raced the revoke is ignored
    t.add(P0, 3)  # assigned again later, from the group's committed position
    t.done(P0, 3)
    assert t.committable() == {P0: 4}


class OffsetMachine(RuleBasedStateMachine):
    """Random adds (with gaps), answers in any order, commits and revokes."""

    def __init__(self) -> None:
        super().__init__()
        self.t = OffsetTracker()
        self.next: dict[tuple[str, int], int] = {P0: 0, P1: 100}
        self.unanswered: dict[tuple[str, int], set[int]] = {P0: set(), P1: set()}
        self.last_added: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}

    @rule(partition=st.sampled_from([P0, P1]), gap=st.integers(0, 3))
    def add(self, partition: tuple[str, int], gap: int) -> None:
        offset = self.next[partition] + gap
        self.t.add(partition, offset)
        self.next[partition] = offset + 1
        self.unanswered[partition].add(offset)
        self.last_added[partition] = offset
        self.committed.setdefault(partition, offset)  # the group's position is at most this

    @precondition(lambda self: any(self.unanswered.values()))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        pending = sorted((p, o) for p, offsets in self.unanswered.items() for o in offsets)
        partition, offset = data.draw(st.sampled_from(pending))
        self.t.done(partition, offset)
        self.unanswered[partition].remove(offset)

    @rule()
    def commit(self) -> None:
        offsets = self.t.committable()
        self.t.mark_committed(offsets)
        self.committed.update(offsets)
        assert self.t.committable() == {}

    @rule(partition=st.sampled_from([P0, P1]))
    def revoke(self, partition: tuple[str, int]) -> None:
        self.t.forget([partition])
        self.unanswered[partition] = set()
        self.last_added.pop(partition, None)
        self.committed.pop(partition, None)

    @invariant()
    def never_ahead_of_an_unanswered_offset(self) -> None:
        committable = self.t.committable()
        for partition, unanswered in self.unanswered.items():
            assert self.t.pending(partition) == len(unanswered)
            if partition not in self.last_added:
                assert partition not in committable
                continue
            position = min(unanswered) if unanswered else self.last_added[partition] + 1
            advanced = position > self.committed[partition]
            assert committable.get(partition) == (position if advanced else None)


OffsetMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_offset_machine = OffsetMachine.TestCase
