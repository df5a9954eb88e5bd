"""Weighted fair share between batches (batcher/fairshare.py): shares by weight, no burst
for late or idle batches, never more than what waits."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher.fairshare import (
    MAX_SLICE_RATIO,
    MAX_TOKENS,
    MAX_WEIGHT,
    MIN_WEIGHT,
    FairShare,
    clamp_weight,
)


def serve(fair: FairShare, total: int, room: int = 10_000) -> Counter[str]:
    served: Counter[str] = Counter()
    while sum(served.values()) < total:
        picked = fair.next(room)
        assert picked is not None
        served[picked[0]] += picked[1]
    return served


def test_a_small_batch_added_behind_a_large_one_is_served_within_its_first_turns() -> None:
    fair = FairShare(quantum=8)
    fair.add("alice", 20_000)
    serve(fair, 800)  # alice ran alone for a while
    fair.add("bob", 10)
    order = [picked for _ in range(4) if (picked := fair.next(10_000)) is not None]
    assert sum(c for b, c in order if b == "bob") == 10  # bob done within two slices each


def test_weights_three_to_one_share_three_to_one() -> None:
    fair = FairShare(quantum=4)
    fair.add("heavy", 100_000, weight=3.0)
    fair.add("light", 100_000, weight=1.0)
    served = serve(fair, 8_000)
    assert served["heavy"] / served["light"] == pytest.approx(3.0, rel=0.02)


def test_a_batch_alone_is_served_as_fast_as_there_is_room() -> None:
    fair = FairShare(quantum=8)
    fair.add("only", 1_000)
    assert fair.next(500) == ("only", 8)  # one slice a call: the caller asks again
    assert fair.next(0) is None


def test_never_more_than_what_waits_and_nothing_once_drained() -> None:
    fair = FairShare(quantum=100)
    fair.add("a", 3)
    assert fair.next(1_000) == ("a", 3)
    assert fair.next(1_000) is None
    assert len(fair) == 0


def test_an_idle_batch_earns_no_burst_when_it_comes_back() -> None:
    fair = FairShare(quantum=1)
    fair.add("steady", 10_000)
    fair.add("bursty", 1)
    serve(fair, 2)  # bursty's one request served; it is idle now
    serve(fair, 1_000)  # steady alone
    fair.add("bursty", 1_000)
    served = serve(fair, 200)
    assert served["bursty"] == pytest.approx(100, abs=2)  # half, not all of it


def test_removed_batches_leave_no_trace() -> None:
    fair = FairShare(quantum=2)
    fair.add("a", 10)
    fair.add("b", 10)
    assert fair.remove("a") == 10
    fair.add("a", 1)  # the same id again: a new batch as far as shares go
    served = serve(fair, 11)
    assert served == Counter({"a": 1, "b": 10})


def test_refuses_what_cannot_be_a_share() -> None:
    with pytest.raises(ValueError, match="quantum"):
        FairShare(quantum=0)
    with pytest.raises(ValueError, match="weight"):
        FairShare(quantum=1).add("a", 1, weight=math.nan)


@pytest.mark.parametrize("tiny", [1e-308, 5e-324, 1e-305, 0.0, -1.0])
def test_a_tiny_weight_runs_at_the_floor_and_never_overflows(tiny: float) -> None:
    """Issue 38: 1e-308 raised OverflowError in the slice size (every feeder crash-looped);
    1e-305 made the virtual time inf, after which 3:1 weights came out 1:1."""
    fair = FairShare(quantum=64)
    fair.add("tiny", 10**9, weight=tiny, key="t", tokens=1e300)
    fair.add("heavy", 10**9, weight=3.0, key="h")
    fair.add("light", 10**9, weight=1.0, key="l")
    served = serve(fair, 4_000_000)  # slices of 64 quanta: the tiny weight is the floor
    assert served["heavy"] / served["light"] == pytest.approx(3.0, rel=0.02)
    assert 0 < served["tiny"] < served["light"]
    assert all(math.isfinite(k.tag) for k in fair._keys.values())


def test_a_slice_is_at_most_max_slice_ratio_quanta() -> None:
    fair = FairShare(quantum=64)
    fair.add("light", 10**6, weight=MIN_WEIGHT, key="l")
    fair.add("heavy", 10**6, weight=MAX_WEIGHT, key="h")
    assert {fair.next(10**9) for _ in range(3)} <= {
        ("heavy", 64 * MAX_SLICE_RATIO),
        ("light", 64),
    }


weights = st.one_of(
    st.floats(MIN_WEIGHT, MAX_WEIGHT),
    st.sampled_from([1e-308, 5e-324, 1e-305, 1e308, math.inf, 0.0, -1.0]),
)


@given(
    st.lists(
        st.tuples(weights, st.floats(0.0, 1e30, allow_nan=False), st.booleans()),
        min_size=2,
        max_size=5,
    ),
    st.integers(1, 64),
)
def test_weights_stay_honoured_whatever_the_numbers(
    batches: list[tuple[float, float, bool]], quantum: int
) -> None:
    """Start-time fair queueing's bound, at every step while all are backlogged: two keys'
    service in tokens ÷ weight differ by at most one slice of each (the largest slice's
    cost ÷ its weight); extreme weights and token counts are clamped, tags stay finite
    (rebased as they grow), and nothing raises."""
    fair = FairShare(quantum)
    charged: dict[str, tuple[float, float]] = {}  # key -> (weight, tokens) as clamped
    for i, (weight, tokens, _) in enumerate(batches):
        fair.add(f"b{i}", 10**12, weight=weight, key=f"k{i}", tokens=tokens)
        charged[f"b{i}"] = (clamp_weight(weight), min(float(MAX_TOKENS), max(1.0, tokens)))
    served: Counter[str] = Counter()
    largest: dict[str, float] = {}
    for _ in range(300):
        picked = fair.next(10**9)
        assert picked is not None
        batch, count = picked
        weight, tokens = charged[batch]
        served[batch] += count
        largest[batch] = max(largest.get(batch, 0.0), count * tokens / weight)
        normalized = {b: served[b] * t / w for b, (w, t) in charged.items()}
        bound = sum(largest.values()) + max(
            quantum * MAX_SLICE_RATIO * t / w for w, t in charged.values()
        )
        assert max(normalized.values()) - min(normalized.values()) <= bound * (1 + 1e-9)
    assert all(math.isfinite(k.tag) for k in fair._keys.values())


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 50), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 16),
)
def test_every_request_is_served_exactly_once(
    arrivals: list[tuple[int, int, float]], quantum: int
) -> None:
    fair = FairShare(quantum)
    added: Counter[str] = Counter()
    weights: dict[str, float] = {}
    for batch, count, weight in arrivals:
        name = f"b{batch}"
        weight = weights.setdefault(name, weight)  # a batch keeps its weight
        fair.add(name, count, weight)
        added[name] += count
    served = serve(fair, sum(added.values()), room=7)
    assert served == added
    assert fair.next(7) is None


def test_splitting_into_ten_batches_gets_a_key_no_more() -> None:
    """Issue 33, item 4: alice's work in 10 batches against bob's 1 got 0.91 vs 0.09."""
    fair = FairShare(quantum=64)
    for k in range(10):
        fair.add(f"alice-{k}", 10_000, key="alice")
    fair.add("bob-0", 100_000, key="bob")
    served = serve(fair, 20_000)
    alice = sum(n for b, n in served.items() if b.startswith("alice"))
    assert alice / sum(served.values()) <= 0.55
    # and within alice, her batches share alike
    assert max(served[f"alice-{k}"] for k in range(10)) <= 2 * min(
        served[f"alice-{k}"] for k in range(10)
    )


def test_keys_are_charged_in_tokens_not_requests() -> None:
    fair = FairShare(quantum=16)
    fair.add("long", 100_000, key="a", tokens=400.0)
    fair.add("short", 100_000, key="b", tokens=100.0)
    served = serve(fair, 10_000)
    assert served["short"] / served["long"] == pytest.approx(4.0, rel=0.05)


def test_a_low_weight_gives_full_slices_not_one_record() -> None:
    """Issue 33, item 3: 64 batches at weight 0.015 were fed one record a turn."""
    fair = FairShare(quantum=64)
    for k in range(64):
        fair.add(f"b{k}", 1_000, weight=0.015, key=f"k{k}")
    assert all(picked[1] == 64 for _ in range(64) if (picked := fair.next(10_000)))
    fair.add("heavy", 1_000, weight=0.03, key="h")  # twice the lightest: twice its slice
    counts = {b: n for _ in range(70) if (picked := fair.next(10_000)) for b, n in [picked]}
    assert counts["heavy"] == 128


def test_a_key_weighs_its_heaviest_active_batch() -> None:
    fair = FairShare(quantum=4)
    fair.add("a-bg", 100_000, weight=1.0, key="a")
    fair.add("a-fg", 100_000, weight=3.0, key="a")
    fair.add("b", 100_000, weight=3.0, key="b")
    served = serve(fair, 12_000)
    a = served["a-bg"] + served["a-fg"]
    assert a / served["b"] == pytest.approx(1.0, rel=0.05)  # 3 against 3
    assert served["a-fg"] / served["a-bg"] == pytest.approx(3.0, rel=0.05)  # 3:1 inside
