"""The feeder's index of the pending partition (worker/feeder/index.py): runs per batch,
what was fed, the offset that may be committed, and a takeover that skips what was fed."""

from __future__ import annotations

import pytest

from worker.feeder import index as index_module
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


def test_after_five_takeovers_no_state_is_left_for_a_finished_batch() -> None:
    """Issue 38: a batch fed to its end but not retired when its feeder handed over was
    skipped by the next feeder's scan and never tombstoned: state entries piled up with
    every takeover. Here each feeder feeds a small batch whole while an old one pins the
    committed offset, commits (state and offset as the mover writes them), and hands
    over; after five, everything is fed and the state topic (folded) holds nothing."""
    state: dict[str, int] = {}  # the compacted state topic: batch -> fed_to
    committed = 0
    layout = "p" * 10  # the pinning batch, fed a record per feeder
    for takeover in range(5):
        layout += str(takeover) * 3  # a small batch published meanwhile
        index = scanned(layout[committed:].rjust(len(layout), "."), PendingIndex(state, committed))
        index.fed("p", index.cursor("p"))
        for offset in range(index.cursor(str(takeover)), len(layout)):
            index.fed(str(takeover), offset)
        committed = index.low_water()
        state.update({b: index.fed_to[b] for b in ("p", str(takeover))})
        for gone in index.retire(committed):
            del state[gone]
        assert committed < len(layout)  # p pins it: the small batch is not retired yet
        assert str(takeover) in state
    index = scanned(layout[committed:].rjust(len(layout), "."), PendingIndex(state, committed))
    while "p" in index.batches:
        index.fed("p", index.cursor("p"))
    for gone in index.retire(index.low_water()):
        del state[gone]
    assert state == {}


def test_state_below_where_a_feeder_starts_is_retired_at_its_first_commit() -> None:
    index = PendingIndex({"old": 40, "live": 90}, start=50)
    assert index.retire(index.low_water()) == ["old"]
    assert index.fed_to == {"live": 90}


def test_the_index_is_full_at_its_bound_of_runs_and_frees_as_it_is_fed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(index_module, "MAX_RUNS", 4)
    index = scanned("abab")  # a record per run: publishers interleaved one at a time
    assert index.runs == 4 and index.full
    index.fed("a", 0)
    assert index.runs == 3 and not index.full
    scanned("....c", index)
    assert index.full
    assert index.abandon("b") == 2 and index.runs == 2


def test_the_index_is_full_at_its_bound_of_active_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(index_module, "MAX_BATCHES", 3)
    index = scanned("abc")  # a hostile publisher: a batch a record
    assert index.full
    index.fed("b", 1)
    assert not index.full
