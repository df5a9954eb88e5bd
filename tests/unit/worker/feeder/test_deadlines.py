"""Deadlines (docs/architecture.md §10, worker/feeder/deadlines.py): a batch whose unfed
requests, at the fleet's recent pace, need more than half the time left to its deadline
(and no more than all of it: else it is hopeless) is fed earliest deadline first, ahead
of fair share's choice, in at most half of the room summed over the steps and charged as
its own turns; a deadline is anyone's header, so a bad one is none and a tenant claiming
early deadlines on everything still leaves the others half."""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import Message

from tests.unit.worker.feeder.test_quarantine import Feeder, record
from worker.feeder.deadlines import RISK_EVERY_S, Deadlines
from worker.feeder.headers import Charging
from worker.feeder.plan import Planner

NOW = 1_000_000.0


class Wall:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def test_at_risk_is_more_unfed_work_than_half_the_time_left() -> None:
    wall = Wall()
    deadlines = Deadlines(wall)
    for batch_id, deadline in {"late": 30.0, "later": 25.0, "easy": 50.0, "gone": -1.0}.items():
        deadlines.note(batch_id, NOW + deadline)
    deadlines.note("late", NOW + 1e6)  # a later record cannot move it
    waiting = dict.fromkeys(["late", "later", "easy", "gone"], 40).get
    # 40 requests at 2 a second: 20 s; at risk when that is more than half the time left
    assert deadlines.at_risk(2.0, lambda b: waiting(b) or 0, {"late", "later", "easy", "gone"}) == [
        "later",
        "late",
    ]
    wall.now += RISK_EVERY_S
    assert deadlines.at_risk(0.0, lambda b: 40, {"late"}) == []  # pace unknown: no claim
    assert len(deadlines) == 1  # batches no longer active are forgotten
    wall.now += RISK_EVERY_S
    assert deadlines.at_risk(2.0, lambda b: 0, {"late"}) == []  # everything fed


def planner(records: list[Message], wall: Wall) -> Planner:
    feeder = Feeder(records)  # its index, read-ahead, drain and Tiers(4)
    p = Planner(feeder.index, feeder.fair, feeder.ahead, feeder.drain, Charging(), wall=wall)
    p.note(records)
    return p


def batches(deadline: bytes) -> list[Message]:
    """Two batches fair share serves first, then one with ``deadline`` (relative to NOW)."""
    later = str(NOW + float(deadline)).encode() if deadline[:1].isdigit() else deadline
    return [
        *(record(o, "a") for o in range(40)),
        *(record(40 + o, "b") for o in range(40)),
        *(record(80 + o, "late", batchpipe_deadline=later) for o in range(40)),
    ]


def test_a_batch_whose_window_is_at_risk_is_fed_ahead_of_fair_share() -> None:
    p = planner(batches(b"30"), Wall())  # 40 unfed at 2 a second: 20 s > 30 s ÷ 2
    step = p.plan(8, 16, rate=2.0)
    assert [(b, len(r)) for b, r in step.slices] == [("late", 4), ("a", 4)]
    # the same batch with time to spare: fair share's order, a, b, then the late one
    relaxed = planner(batches(b"50"), Wall()).plan(8, 16, rate=2.0)
    assert [b for b, _ in relaxed.slices] == ["a", "b"]


@pytest.mark.parametrize("deadline", [b"nan", b"inf", b"-5", b"x" * 40, b"1e999", b"0"])
def test_a_bad_or_passed_deadline_claims_nothing(deadline: bytes) -> None:
    step = planner(batches(deadline), Wall()).plan(8, 16, rate=2.0)
    assert [b for b, _ in step.slices] == ["a", "b"]


def test_a_tenant_claiming_early_deadlines_still_leaves_the_others_half() -> None:
    wall = Wall()
    p = planner(batches(b"30"), wall)  # at risk for all it has (20 s of 30)
    fed: Counter[str] = Counter()
    for _ in range(8):
        for b, records in p.plan(8, 16, rate=2.0).slices:
            fed[b] += len(records)
        wall.now += 0.05
    assert fed == {"late": 32, "a": 16, "b": 16}
    # and it was charged: with its deadline passed, fair share serves the others first
    wall.now = NOW + 30 + RISK_EVERY_S
    assert [b for b, _ in p.plan(8, 16, rate=2.0).slices] == ["a", "b"]


def test_at_risk_takes_half_of_what_is_fed_when_credits_free_one_slot_a_step() -> None:
    """Credits free a slot or two at a time on a full fleet: a room of 1 each step gave
    batches at risk every record (half of 1, rounded up); the half is carried instead."""
    wall = Wall()
    p = planner(batches(b"150"), wall)  # 40 unfed at 0.5 a second: 80 s of 150, at risk
    fed: Counter[str] = Counter()
    for _ in range(60):
        for b, records in p.plan(1, 16, rate=0.5).slices:
            fed[b] += len(records)
    assert fed.total() == 60
    assert fed["late"] == 30  # one record every other step
    for room in (2, 3, 5):  # any room: at most half, over the steps
        p = planner(batches(b"150"), Wall())
        risky = sum(
            len(records)
            for _ in range(12)
            for b, records in p.plan(room, 16, rate=0.5).slices
            if b == "late"
        )
        assert risky <= room * 12 / 2, room


def test_a_batch_that_cannot_finish_even_with_the_whole_fleet_is_not_fed_edf() -> None:
    """40 unfed at 2 a second need 20 s; with 10 s left it misses whatever it is fed, and
    EDF would take half the fleet until its deadline for nothing: fair share serves it."""
    wall = Wall()
    deadlines = Deadlines(wall)
    deadlines.note("hopeless", NOW + 10.0)
    deadlines.note("tight", NOW + 20.0)  # exactly the whole fleet's time: still at risk
    assert deadlines.at_risk(2.0, lambda b: 40, {"hopeless", "tight"}) == ["tight"]
    step = planner(batches(b"10"), Wall()).plan(8, 16, rate=2.0)
    assert [b for b, _ in step.slices] == ["a", "b"]
