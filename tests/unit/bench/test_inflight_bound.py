"""The in-flight bound of ``bench.inflight``: the echo step model with an instant feeder."""

from __future__ import annotations

import pytest

from bench.inflight import PER_SEQ_S, STEP_S, in_flight_bound


def test_equal_lengths_keep_every_slot_full() -> None:
    # two waves of two 3-token requests: six full steps, nothing left to drain
    bound = in_flight_bound([3, 3, 3, 3], slots=2)
    assert bound["slot_idle_fraction"] == 0.0
    assert bound["seconds"] == round(6 * (STEP_S + 2 * PER_SEQ_S), 2)


def test_a_freed_slot_is_refilled_before_the_next_step_and_the_drain_idles() -> None:
    # [2, 5] for two steps; then the 2 has ended and the 1 joins the 5's third step; then
    # the 5 drains alone: occupancy 2, 2, 2, 1, 1 of 2 slots
    bound = in_flight_bound([2, 5, 1], slots=2)
    assert bound["slot_idle_fraction"] == pytest.approx(0.2)
    assert bound["tokens_per_s"] == round(
        8 / (3 * (STEP_S + 2 * PER_SEQ_S) + 2 * (STEP_S + PER_SEQ_S)), 1
    )
