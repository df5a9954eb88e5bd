"""A feeder with requests waiting that feeds nothing while workers have free slots says so
(worker/feeder/stall.py, issue 50): the chaos run that stalled said nothing at all."""

from __future__ import annotations

from worker.feeder.credits import STALE_S, Credits
from worker.feeder.demand import Demand
from worker.feeder.stall import STALL_S, StallWatch


def free_slots() -> bool:  # what Credits.idle says: a worker reports free slots ...
    return True


def all_busy() -> bool:  # ... or every worker's slots are busy
    return False


nobody_reports = free_slots  # no worker reports at all: a stall as well (Credits.idle)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stall_with_free_slots_is_warned_then_again_while_it_lasts() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    assert watch.step(waiting=10, moved=0, idle=free_slots) is None  # starts the watch
    clock.now += STALL_S - 1
    assert watch.step(10, 0, free_slots) is None
    clock.now += 1
    assert watch.step(10, 0, free_slots) == STALL_S
    clock.now += 1
    assert watch.step(10, 0, free_slots) is None  # once, not every step
    clock.now += STALL_S
    assert watch.step(10, 0, free_slots) == 2 * STALL_S + 1  # how long in all


def test_no_worker_reporting_is_a_stall_too() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    watch.step(5, 0, nobody_reports)
    clock.now += STALL_S
    assert watch.step(5, 0, nobody_reports) == STALL_S


def test_full_workers_idle_feeders_and_feeding_are_no_stall() -> None:
    clock = Clock()
    watch = StallWatch(clock)
    watch.step(10, 0, all_busy)
    clock.now += 10 * STALL_S
    assert watch.step(10, 0, all_busy) is None  # every slot busy: long requests, not a stall
    assert watch.step(0, 0, free_slots) is None  # nothing waits
    clock.now += 10 * STALL_S
    assert watch.step(10, 0, free_slots) is None  # the watch starts again
    clock.now += STALL_S / 2
    assert watch.step(10, 3, free_slots) is None  # fed: the watch starts again
    clock.now += STALL_S / 2 + 1
    assert watch.step(10, 0, free_slots) is None


def test_describe_says_how_each_credit_is_made() -> None:
    clock = Clock()
    credits = Credits(64, clock=clock, wall=clock, engine=32)
    credits.report(Demand("w1", clock.now, ((0, 5), (3, 7)), held=2, running=1, free=62))
    credits.report(Demand("w2", clock.now, ((1, 0),), held=0, running=0, free=64))
    placed = credits.place(3)
    for offset, partition in enumerate(placed):
        credits.delivered(partition, 10 + offset)
    text = credits.describe()
    assert "w1 credit" in text and "[0@5,3@7]" in text
    assert "w2 credit" in text and "free 64 held 0 running 0" in text
    assert credits.idle()  # w2 has free slots
    credits.report(Demand("w2", clock.now, ((1, 0),), held=64, running=64, free=0))
    credits.report(Demand("w1", clock.now, ((0, 5), (3, 7)), held=64, running=64, free=0))
    assert not credits.idle()  # every slot busy
    clock.now += STALE_S + 1
    assert "w1 stale 4.0s" in credits.describe()
    assert credits.idle() and not credits.live()  # nobody reports: nothing can be fed
