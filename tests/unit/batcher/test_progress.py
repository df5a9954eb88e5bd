"""Progress: what one owner of a partition tells the next about answers above the commit.

A chain of owners is modelled without Kafka: each reads a prefix of the partition from the
last committed offset, answers a random subset in any order, then hands over with
:meth:`OffsetTracker.progress` (the "transaction"); the next inherits it. Every record must
be answered exactly once over the whole chain, and a stale hand-over (an older progress
record) may only repeat answers, never lose one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import OffsetTracker, Progress

P0 = ("requests", 0)


def test_progress_lists_what_is_unanswered_between_the_commit_and_the_highest_answer() -> None:
    t = OffsetTracker()
    for offset in range(6):
        t.add(P0, offset)
    for offset in (1, 3, 4):
        t.done(P0, offset)
    assert t.progress(P0) == Progress(committed=0, highest=4, unanswered=(0, 2))
    t.done(P0, 0)
    assert t.progress(P0) == Progress(committed=2, highest=4, unanswered=(2,))


def test_an_inherited_progress_skips_what_it_says_is_answered() -> None:
    t = OffsetTracker()
    t.inherit(P0, Progress(committed=2, highest=6, unanswered=(3, 5)))
    assert [t.add(P0, o) for o in range(2, 9)] == [False, True, False, True, False, True, True]
    # 2, 4 and 6 skipped: the position stops at 3, the first record to answer here
    assert t.position(P0) == 3
    t.done(P0, 3)
    t.done(P0, 5)
    assert t.position(P0) == 7


def test_what_was_inherited_and_not_read_yet_is_handed_on() -> None:
    t = OffsetTracker()
    t.inherit(P0, Progress(committed=0, highest=9, unanswered=(4, 7)))
    assert [t.add(P0, o) for o in range(3)] == [False, False, False]
    assert t.progress(P0) == Progress(committed=3, highest=9, unanswered=(4, 7))
    # nothing read at all: handed on as it came
    fresh = OffsetTracker()
    fresh.inherit(P0, Progress(1, 5, (2,)))
    assert fresh.progress(P0) == Progress(1, 5, (2,))


def test_a_gap_counts_answered_and_offsets_must_still_increase() -> None:
    t = OffsetTracker()
    t.inherit(P0, Progress(committed=0, highest=4, unanswered=(2,)))
    assert t.add(P0, 2)  # 0 and 1 were transaction markers: never read
    with pytest.raises(ValueError, match="tracked already"):
        t.inherit(P0, Progress(0, 0))
    with pytest.raises(ValueError, match="must increase"):
        t.add(P0, 1)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    length=st.integers(1, 40),
    owners=st.integers(1, 6),
    stale=st.booleans(),
)
def test_a_chain_of_owners_answers_every_record_once(
    data: st.DataObject, length: int, owners: int, stale: bool
) -> None:
    answers = [0] * length
    committed = 0  # the group's committed offset
    handed: list[Progress] = []  # every progress record committed, oldest first
    for _ in range(owners):
        tracker = OffsetTracker()
        if handed:
            # a stale reader (the embedded broker's OffsetFetch ignores require_stable)
            # may find an older record than the last
            pick = data.draw(st.integers(0, len(handed) - 1)) if stale else len(handed) - 1
            tracker.inherit(P0, handed[pick])
        read_to = data.draw(st.integers(committed, length))
        fresh = [o for o in range(committed, read_to) if tracker.add(P0, o)]
        chosen = data.draw(st.lists(st.sampled_from(fresh), unique=True)) if fresh else []
        for offset in chosen:
            answers[offset] += 1
            tracker.done(P0, offset)
        progress = tracker.progress(P0)
        if progress is None:
            continue  # read nothing, inherited nothing: no record written
        # the promise a reader relies on: nothing unanswered is said to be answered
        for offset in range(length):
            if progress.answered(offset):
                assert answers[offset] >= 1, (offset, progress)
        handed.append(progress)
        committed = progress.committed
    # the last owner reads everything left and answers it all
    last = OffsetTracker()
    if handed:
        last.inherit(P0, handed[-1])
    for offset in range(committed, length):
        if last.add(P0, offset):
            answers[offset] += 1
            last.done(P0, offset)
    assert last.position(P0) in (None, length)
    assert min(answers) >= 1  # nothing lost (a stale record may repeat, never lose)
    if not stale:
        assert max(answers) == 1  # and, reading the current record, nothing repeated
