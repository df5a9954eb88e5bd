"""The feeder's index of the pending partition (worker/feeder/index.py): runs per batch,
what was fed, the offset that may be committed, and a takeover that skips what was fed."""

from __future__ import annotations

import pytest

from worker.feeder.index import PendingIndex, Run


def scanned(layout: str, index: PendingIndex | None = None) -> PendingIndex:
    """Scan one record per letter ("aab" = a at 0, a at 1, b at 2); '.' is a marker."""
    index = index or PendingIndex()
    for offset, batch in enumerate(layout):
        if batch != ".":
            index.scan(offset, batch, 1.0)
    return index


def test_consecutive_records_of_a_batch_form_one_run_markers_included() -> None:
    index = scanned("aa.ab.b")
    assert list(index.batches["a"].runs) == [Run(0, 4, 3)]
    assert list(index.batches["b"].runs) == [Run(4, 7, 2)]
    assert index.frontier == 7


def test_feeding_moves_the_cursor_and_the_low_water_mark() -> None:
    index = scanned("aabbba")
    assert index.low_water() == 0
    for offset in (2, 3, 4):  # b is fed first
        assert index.cursor("b") == offset
        index.fed("b", offset)
    assert "b" not in index.batches and index.finished == {"b": 5}
    assert index.low_water() == 0  # a's records still wait
    index.fed("a", 0)
    index.fed("a", 1)
    assert index.cursor("a") == 5 and index.fed_to["a"] == 5
    assert index.low_water() == 5


def test_retire_drops_state_only_below_the_committed_offset() -> None:
    index = scanned("ab")
    index.fed("b", 1)
    assert index.retire(index.low_water()) == []  # a (at 0) keeps the offset below b
    index.fed("a", 0)
    assert index.low_water() == 2
    assert sorted(index.retire(2)) == ["a", "b"]
    assert index.fed_to == {}


def test_a_new_feeder_skips_what_its_state_says_was_fed() -> None:
    # a fed up to 2 and b not at all, then the feeder died: the next one scans from 0
    index = scanned("aabab", PendingIndex(fed_to={"a": 2}))
    assert list(index.batches["a"].runs) == [Run(3, 4, 1)]
    assert list(index.batches["b"].runs) == [Run(2, 3, 1), Run(4, 5, 1)]


def test_a_record_outside_the_next_run_is_refused() -> None:
    index = scanned("aab.a")
    index.fed("a", 1)  # offset 0 read as a marker would be: skipped within the run
    with pytest.raises(ValueError, match="next run"):
        index.fed("a", 0)  # behind the cursor
    with pytest.raises(ValueError, match="next run"):
        index.fed("a", 4)  # the run after next


def test_retire_visits_only_what_it_retires_and_skips_a_batch_active_again() -> None:
    index = PendingIndex()
    for offset in range(100_000):  # 100,000 one-record batches, all fed
        index.scan(offset, f"b{offset}", 1.0)
        index.fed(f"b{offset}", offset)
    assert index.retire(10) == [f"b{o}" for o in range(10)]
    assert len(index.finished) == 99_990 and len(index._finished_order) == 99_990
    index.scan(100_000, "b50", 1.0)  # b50 again: active, its old end no longer retires it
    assert "b50" not in index.retire(60) and "b50" in index.batches
