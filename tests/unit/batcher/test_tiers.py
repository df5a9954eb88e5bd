"""Service tiers (batcher/tiers.py): priority within a per-key allowance, default by fair
share, flex only from capacity nothing else wants; pure, no I/O."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher.errors import BatchpipeError
from batcher.tiers import (
    DEFAULT,
    FLEX,
    FLEX_TAG,
    PRIORITY,
    TierRefusedError,
    Tiers,
    check_allowance,
    clamp_share,
    priority_share,
    tier_of,
)


def steps(tiers: Tiers, rounds: int, room: int) -> Counter[str]:
    """Feed ``rounds`` steps of ``room`` each, as the planner does; records per batch."""
    fed: Counter[str] = Counter()
    for _ in range(rounds):
        tiers.accrue(room)
        left = room
        while left > 0 and (picked := tiers.next(left)) is not None:
            fed[picked[0]] += picked[1]
            left -= picked[1]
    return fed


def test_flex_is_fed_only_when_no_other_batch_waits() -> None:
    tiers = Tiers(4)
    tiers.add("flex", 20, key="carol", tier=FLEX)
    assert tiers.next(4) == ("flex", 4)  # the fleet is idle: flex takes it
    assert tiers.tag >= FLEX_TAG and tiers.tier == FLEX
    tiers.add("work", 8, key="alice")  # a default batch arrives: flex gives way at once
    assert tiers.next(4) == ("work", 4) and tiers.tag < FLEX_TAG
    assert tiers.next(4) == ("work", 4)
    assert tiers.next(4) == ("flex", 4)  # nothing else waits any more
    assert tiers.waiting_by_tier == Counter({FLEX: 12, DEFAULT: 0})


def test_flex_takes_only_its_own_room_and_never_beyond_credit() -> None:
    tiers = Tiers(64)
    tiers.add("flex", 100, tier=FLEX)
    tiers.accrue(10, flex_room=3)  # the workers' free slots, no cushion
    assert tiers.next(10) == ("flex", 3)
    assert tiers.next(7) is None
    tiers.accrue(0, flex_room=0)
    assert tiers.next(0, fresh=32) is None  # a newcomer's overdraft is not flex's


def test_flex_waits_while_the_other_tiers_room_is_spent() -> None:
    tiers = Tiers(4)
    tiers.add("flex", 20, tier=FLEX)
    tiers.add("work", 100, key="alice")
    assert tiers.next(4) == ("work", 4)
    # a newcomer's first slice beyond credit is the default batch's, never flex's
    assert tiers.next(0, fresh=8) is None


def test_priority_is_fed_ahead_within_its_keys_allowance() -> None:
    tiers = Tiers(64, lambda key: 0.5)
    tiers.add("bulk", 1000, key="alice")
    assert tiers.next(10) == ("bulk", 10)
    tiers.add("urgent", 50, key="bob", tier=PRIORITY)
    tiers.accrue(10)
    assert tiers.next(10) == ("urgent", 5)  # half the step's room, ahead of fair share
    assert (tiers.tag, tiers.tag_step, tiers.tier) == (0.0, 0.0, PRIORITY)


def test_one_key_asking_for_priority_does_not_take_the_fleet() -> None:
    tiers = Tiers(8, lambda key: 0.5)
    tiers.add("bulk", 10_000, key="alice")
    tiers.add("mine", 10_000, key="bob", tier=PRIORITY)
    fed = steps(tiers, 100, 20)
    assert sum(fed.values()) == 2000
    # bob gets his allowance ahead; fair share then serves alice until she catches up
    assert 0.45 <= fed["bulk"] / 2000 <= 0.55, fed


def test_a_priority_batch_beyond_its_allowance_is_fed_as_a_default_one() -> None:
    tiers = Tiers(8, lambda key: 0.0)  # no allowance: plain fair share between the keys
    tiers.add("bulk", 10_000, key="alice")
    tiers.add("mine", 10_000, key="bob", tier=PRIORITY)
    fed = steps(tiers, 50, 16)
    assert fed["bulk"] == fed["mine"] == 400


def test_priority_beats_a_heavier_key_and_fair_share_holds_among_priority_keys() -> None:
    weighted = Tiers(8, lambda key: 0.5)
    weighted.add("bulk", 10_000, key="alice", weight=100.0)
    weighted.add("p1", 10_000, key="bob", tier=PRIORITY)
    weighted.add("p2", 10_000, key="carol", tier=PRIORITY)
    fed = steps(weighted, 50, 20)
    # each priority key its allowance first: the weight-100 key only what is left
    assert fed["p1"] + fed["p2"] >= 0.95 * 1000
    without = Tiers(8, lambda key: 0.5)
    without.add("bulk", 10_000, key="alice", weight=100.0)
    without.add("p1", 10_000, key="bob")
    without.add("p2", 10_000, key="carol")
    plain = steps(without, 50, 20)
    assert plain["p1"] + plain["p2"] < 0.1 * 1000  # by weight alone bob and carol wait


def test_an_allowance_banks_at_most_one_step_and_nothing_without_room() -> None:
    tiers = Tiers(64, lambda key: 0.5)
    tiers.add("bulk", 1000, key="alice")
    tiers.add("urgent", 100, key="bob", tier=PRIORITY)
    for _ in range(10):
        tiers.accrue(0)  # a full fleet earns nothing
    tiers.accrue(10)
    tiers.accrue(10)
    assert tiers.next(100) == ("urgent", 5)  # one step's worth, not two
    tiers.accrue(1)  # half a record: one record may be banked
    tiers.accrue(1)
    assert tiers.next(1) == ("urgent", 1)


def test_deadlines_rush_a_flex_batch_only_while_nothing_else_waits() -> None:
    tiers = Tiers(4)
    tiers.add("flex", 10, tier=FLEX)
    tiers.add("work", 10, key="alice")
    assert tiers.serve("flex", 4) == 0
    assert tiers.serve("work", 4) == 4
    tiers.remove("work")
    assert tiers.serve("flex", 4) == 4 and tiers.tag >= FLEX_TAG


def test_fair_share_holds_within_the_flex_tier() -> None:
    tiers = Tiers(4)
    tiers.add("a", 1000, key="x", tier=FLEX)
    tiers.add("b", 1000, key="y", tier=FLEX, weight=3.0)
    fed = steps(tiers, 50, 16)
    assert abs(fed["b"] / fed["a"] - 3.0) < 0.2, fed


def test_a_batch_keeps_its_first_tier_and_unknown_tiers_are_default() -> None:
    assert tier_of("express") == tier_of("") == tier_of("PRIORITY") == DEFAULT
    assert tier_of("flex") == FLEX
    tiers = Tiers(4)
    tiers.add("b", 2, tier=FLEX)
    tiers.add("b", 2, tier=PRIORITY)  # a later record cannot move it
    assert tiers.waiting_by_tier == Counter({FLEX: 4})
    assert tiers.remove("b") == 4 and "b" not in tiers and len(tiers) == 0
    assert clamp_share(float("nan")) == 0.0 and clamp_share(7.0) == 1.0


def test_a_keys_allowance_is_its_entry_else_stars_else_a_half_and_zero_refuses_priority() -> None:
    shares = {"alice": 0.3, "bob": 0.0, "eve": -2.0, "*": 0.1}
    assert priority_share(shares, "alice") == 0.3 and priority_share(shares, "carol") == 0.1
    assert priority_share({"alice": 7.0}, "alice") == 1.0
    assert priority_share({}, "carol") == priority_share({"alice": 0.0}, "carol") == 0.5
    for tier in (DEFAULT, FLEX):  # only priority asks for an allowance
        assert check_allowance(tier, shares, "bob", "--tier") == tier
    assert check_allowance(PRIORITY, shares, "carol", "--tier") == PRIORITY
    for key, entry in (("bob", "'bob'] = 0"), ("eve", "'eve'] = -2"), ("carol", "'*'] = 0")):
        stars = {**shares, "*": 0.0}
        with pytest.raises(TierRefusedError) as refused:
            check_allowance(PRIORITY, stars, key, "metadata.batchpipe_tier")
        assert isinstance(refused.value, BatchpipeError) and isinstance(refused.value, ValueError)
        message = str(refused.value)
        assert message.startswith(f"metadata.batchpipe_tier: 'priority' is refused for key {key!r}")
        assert f"allowance is 0 (scheduling.priority_shares[{entry})" in message, message


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([*"pdf"]), st.integers(1, 30)
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.integers(0, 40), min_size=1, max_size=40),
    st.floats(0.0, 1.0),
)
def test_every_request_is_fed_once_and_flex_never_before_the_others(
    adds: list[tuple[str, str, int]], rooms: list[int], share: float
) -> None:
    names = {"p": PRIORITY, "d": DEFAULT, "f": FLEX}
    tiers = Tiers(3, lambda key: share)
    total: Counter[str] = Counter()
    for batch, tier, count in adds:
        tiers.add(batch, count, key=batch, tier=names[tier])
        total[batch] += count
    fed: Counter[str] = Counter()
    for room in [*rooms, *[1000] * 200]:
        tiers.accrue(room)
        left = room
        while left > 0 and (picked := tiers.next(left)) is not None:
            batch, count = picked
            assert 1 <= count <= left
            if tiers.tier == FLEX:
                assert not len(tiers.main)  # nothing of another tier waited
            fed[batch] += count
            left -= count
    assert fed == total and len(tiers) == 0
    assert all(v == 0 for v in tiers.waiting_by_tier.values())
