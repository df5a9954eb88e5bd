"""Priority with aging: a steady stream of higher-priority requests never starves a lower one.

Times are multiples of 1/64 s so that every sum and product below is exact in floating
point: the bound is checked to the last bit, not within a tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import BatchLimits, DynamicBatcher, Pending

TICK = 1 / 64


def request(key: str, priority: int, arrival: float, prompt: int = 8) -> Pending[None]:
    return Pending(
        key=key,
        partition=("requests", 0),
        offset=0,
        prompt_tokens=prompt,
        max_tokens=8,
        arrival=arrival,
        payload=None,
        priority=priority,
    )


@settings(max_examples=100, deadline=None)
@given(
    aging_ticks=st.integers(1, 64),
    gap=st.integers(1, 4),
    timeout_ticks=st.sampled_from([0, 1, 6, 64]),
    cadence_ticks=st.integers(1, 64),
    max_batch_size=st.integers(1, 4),
    backlog=st.integers(0, 10),
    length_aware=st.booleans(),
    shared_prefix=st.booleans(),
)
def test_a_low_priority_request_is_served_within_the_stated_bound(
    aging_ticks: int,
    gap: int,
    timeout_ticks: int,
    cadence_ticks: int,
    max_batch_size: int,
    backlog: int,
    length_aware: bool,
    shared_prefix: bool,
) -> None:
    aging_s, timeout_s, cadence_s = aging_ticks * TICK, timeout_ticks * TICK, cadence_ticks * TICK
    b = batcher(aging_s, max_batch_size, timeout_s, length_aware, shared_prefix)
    high = 5
    low = high - gap
    for n in range(backlog):
        b.add(request(f"backlog{n}", high, 0.0), 0.0)
    b.add(request("low", low, 0.0), 0.0)
    # The stated bound (DynamicBatcher's docstring): max((P - p)·s, timeout_s) + N·c, where
    # N is the most requests in flight while it waits and c the interval between batches.
    steps = math.ceil((gap * aging_s + timeout_s) / cadence_s) + backlog + max_batch_size + 4
    served_at, most_in_flight = served(
        b, "low", lambda key, now: request(key, high, now), steps, cadence_s
    )
    assert served_at <= max(gap * aging_s, timeout_s) + most_in_flight * cadence_s


def batcher(
    aging_s: float, size: int, timeout_s: float, length_aware: bool, shared_prefix: bool
) -> DynamicBatcher[None]:
    limits = BatchLimits(
        max_batch_size=size,
        max_batch_tokens=10_000,
        timeout_s=timeout_s,
        length_aware=length_aware,
        shared_prefix=shared_prefix,
        priority_aging_s=aging_s,
    )
    return DynamicBatcher(limits)


def served(
    b: DynamicBatcher[None],
    victim: str,
    adversary: Callable[[str, float], Pending[None]],
    steps: int,
    cadence_s: float,
) -> tuple[float, int]:
    """When ``victim`` (queued at 0) went in a batch, and the most requests in flight
    until then, while before every batch (one every ``cadence_s``) the ``adversary``
    queues enough new requests to fill it alone."""
    most_in_flight = b.in_flight()
    for step in range(1, steps + 1):
        now = step * cadence_s
        for n in range(b.max_batch_size):
            b.add(adversary(f"adversary{step}.{n}", now), now)
        most_in_flight = max(most_in_flight, b.in_flight())
        batch = b.next_batch(now)
        assert batch is not None  # always full: one batch every cadence_s
        for item in batch.items:
            b.complete(item.key)
        if victim in {item.key for item in batch.items}:
            return now, most_in_flight
    raise AssertionError(f"{victim} starved")


def test_aging_orders_by_priority_then_by_wait() -> None:
    limits = BatchLimits(
        max_batch_size=1,
        max_batch_tokens=100,
        length_aware=False,
        shared_prefix=False,
        priority_aging_s=1.0,
    )
    b: DynamicBatcher[None] = DynamicBatcher(limits)
    b.add(request("low-old", 0, 0.0), 0.0)
    b.add(request("high-new", 2, 1.5), 1.5)  # ordered as if it arrived at 1.5 - 2 = -0.5
    b.add(request("mid-new", 1, 1.5), 1.5)  # as if at 0.5
    assert [i.key for i in b.queued()] == ["high-new", "low-old", "mid-new"]


def test_a_request_aged_to_the_top_level_fills_a_batch_as_an_equal() -> None:
    limits = BatchLimits(
        max_batch_size=2, max_batch_tokens=1000, shared_prefix=False, priority_aging_s=1.0
    )
    b: DynamicBatcher[None] = DynamicBatcher(limits)
    b.add(request("anchor", 1, 0.0, prompt=8), 0.0)  # level 3 at now = 2
    b.add(request("aged-low", 0, 0.0, prompt=8), 0.0)  # 0 + 2 s waited: level 2
    for n in range(3):
        b.add(request(f"fresh-high{n}", 2, 2.0, prompt=100), 2.0)  # level 2
    batch = b.next_batch(2.0)
    assert batch is not None
    # at an equal level the length closest to the anchor's wins, not the raw priority
    assert [i.key for i in batch.items] == ["anchor", "aged-low"]


def test_aging_must_be_finite_and_positive() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="priority_aging_s"):
            BatchLimits(priority_aging_s=bad)
