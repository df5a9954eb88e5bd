"""AdaptiveBatchSize: the source document's utilisation rule, bounded and convergent."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import AdaptiveBatchSize


def test_grows_by_twenty_percent_and_at_least_one() -> None:
    a = AdaptiveBatchSize(initial=1, hardware_max=64, interval_s=0.0)
    sizes = [a.observe(0.95, float(t)) for t in range(8)]
    assert sizes == [2, 3, 4, 5, 6, 8, 10, 12]  # ceil(5 * 1.2) is 6, not 7


def test_shrinks_by_twenty_percent_rounded_down_to_one() -> None:
    a = AdaptiveBatchSize(initial=32, hardware_max=64, interval_s=0.0)
    sizes = [a.observe(0.1, float(t)) for t in range(12)]
    assert sizes == [25, 20, 16, 12, 9, 7, 5, 4, 3, 2, 1, 1]


def test_low_utilisation_with_a_backlog_does_not_shrink() -> None:
    a = AdaptiveBatchSize(initial=16, hardware_max=64, interval_s=0.0)
    assert [a.observe(0.1, float(t), queued=40) for t in range(3)] == [16, 16, 16]
    assert a.observe(0.1, 3.0, queued=15) == 12  # fewer waiting than a batch: shrink


def test_holds_between_the_thresholds_and_at_them() -> None:
    a = AdaptiveBatchSize(initial=10, hardware_max=64, interval_s=0.0)
    assert [a.observe(u, float(t)) for t, u in enumerate([0.5, 0.65, 0.8])] == [10, 10, 10]


def test_samples_at_most_once_per_interval() -> None:
    a = AdaptiveBatchSize(initial=10, hardware_max=64, interval_s=1.0)
    assert a.observe(0.9, 0.0) == 12
    assert a.observe(0.9, 0.5) == 12
    assert a.observe(0.9, 1.0) == 15


def test_out_of_memory_halves() -> None:
    a = AdaptiveBatchSize(initial=33, hardware_max=64)
    assert [a.on_out_of_memory() for _ in range(7)] == [16, 8, 4, 2, 1, 1, 1]
    assert a.size == 1


def test_a_backlog_restores_the_size_a_trickle_shrank_from() -> None:
    a = AdaptiveBatchSize(initial=32, hardware_max=64, interval_s=0.0)
    assert [a.observe(0.0, float(t), queued=1) for t in range(2)] == [25, 20]
    assert a.backlog(20) == 20  # no more waiting than the size: nothing to restore
    assert a.backlog(28) == 28  # as far as the queue fills it
    assert a.backlog(63) == 32  # the size the shrinks started from, not the maximum
    assert a.backlog(200) == 32  # restored once: later growth is the rule's
    assert a.observe(0.95, 2.0) == 39


def test_growth_back_to_the_unshrunk_size_forgets_it() -> None:
    a = AdaptiveBatchSize(initial=10, hardware_max=64, interval_s=0.0)
    assert a.observe(0.0, 0.0) == 8
    assert [a.observe(0.95, float(t)) for t in range(1, 3)] == [10, 12]
    assert a.observe(0.0, 3.0) == 9  # a new run of shrinks starts from 12
    assert a.backlog(100) == 12


def test_never_shrunk_or_out_of_memory_is_not_undone_by_a_backlog() -> None:
    a = AdaptiveBatchSize(initial=8, hardware_max=64, interval_s=0.0)
    assert a.backlog(1000) == 8  # the initial size is the operator's, not a shrink
    assert a.observe(0.0, 0.0) == 6
    assert a.on_out_of_memory() == 3
    assert a.backlog(1000) == 3


def test_an_out_of_memory_halves_the_failed_batch_not_a_size_restored_since() -> None:
    a = AdaptiveBatchSize(initial=32, hardware_max=64, interval_s=0.0)
    assert [a.observe(0.0, float(t)) for t in range(4)] == [25, 20, 16, 12]
    limit = a.size  # a batch of 12 goes to the engine; a burst arrives while it runs
    assert a.backlog(100) == 32
    assert a.on_out_of_memory(limit) == 6  # that batch of 12 failed: not 32 // 2
    assert a.backlog(100) == 6  # and no shrink is left to undo


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        AdaptiveBatchSize(initial=0, hardware_max=8)
    with pytest.raises(ValueError):
        AdaptiveBatchSize(initial=9, hardware_max=8)
    with pytest.raises(ValueError):
        AdaptiveBatchSize(initial=1, hardware_max=8, high=0.4, low=0.5)
    with pytest.raises(ValueError):
        AdaptiveBatchSize(initial=1, hardware_max=8, interval_s=-1)


@settings(max_examples=200, deadline=None)
@given(
    hardware_max=st.integers(1, 512),
    data=st.data(),
    events=st.lists(st.floats(0.0, 1.0) | st.just(-1.0) | st.integers(0, 1024), max_size=60),
)
def test_size_stays_within_bounds_and_follows_the_rule(
    hardware_max: int, data: st.DataObject, events: list[float | int]
) -> None:
    """Utilisation readings (floats), out-of-memory (-1.0) and backlogs (ints, queued)."""
    initial = data.draw(st.integers(1, hardware_max))
    a = AdaptiveBatchSize(initial, hardware_max, interval_s=0.0)
    ceiling = initial  # the largest size since the last out-of-memory
    for t, util in enumerate(events):
        before = a.size
        if isinstance(util, int):
            size = a.backlog(util)
            assert before <= size <= max(before, min(util, ceiling))
            continue
        size = a.on_out_of_memory() if util < 0 else a.observe(util, float(t))
        assert 1 <= size <= hardware_max and size == a.size
        ceiling = size if util < 0 else max(ceiling, size)
        if util < 0:
            assert size == max(before // 2, 1)
        elif util > a.high:
            assert size == min(max(math.ceil(before * 1.2 - 1e-9), before + 1), hardware_max)
        elif util < a.low:
            assert size == max(math.floor(before * 0.8 + 1e-9), 1)
        else:
            assert size == before


@settings(max_examples=200, deadline=None)
@given(hardware_max=st.integers(1, 4096), data=st.data())
def test_constant_utilisation_converges(hardware_max: int, data: st.DataObject) -> None:
    initial = data.draw(st.integers(1, hardware_max))
    busy = AdaptiveBatchSize(initial, hardware_max, interval_s=0.0)
    idle = AdaptiveBatchSize(initial, hardware_max, interval_s=0.0)
    # Growth is geometric, so log_1.2(4096) + a few steps reach any bound.
    for t in range(60):
        busy.observe(1.0, float(t))
        idle.observe(0.0, float(t))
    assert busy.size == hardware_max
    assert idle.size == 1
