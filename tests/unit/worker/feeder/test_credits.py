"""Credits from the workers keep a fleet busy whatever its requests take (issue 39).

A fake-clock fleet drives the real :class:`~worker.feeder.demand.Reporter` and
:class:`~worker.feeder.credits.Credits`: ``workers`` workers, each holding one partition
of the requests topic and admitting up to ``SLOTS`` requests, report their demand; an
in-flight engine runs up to ``engine`` of them at a time (all of them, by default) and
the rest wait in the worker's queue; the feeder reads the reports 0.3 s later and feeds
what :meth:`Credits.place` gives. The depth limit this replaces kept 0.20–0.28 of
capacity with 5 % long requests (committed offsets pinned by the long ones) and 25 % of
500 × 64 (``max_depth``).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from worker.feeder.credits import CUSHION_S, STALE_S, Credits
from worker.feeder.demand import Demand, Reporter, decode

STEP_S = 0.1
SLOTS = 64
#: a report reaches the feeder this many steps after it was written (the demand topic's
#: round trip and the feeder's read, generously)
LAG_STEPS = 3


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Wire:
    """The demand topic: reports reach the feeder :data:`LAG_STEPS` steps late."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.late: deque[list[tuple[bytes, bytes]]] = deque([[]] * LAG_STEPS)

    def produce(self, topic: str, *, key: bytes, value: bytes) -> None:
        self.sent.append((key, value))

    def arrived(self) -> list[tuple[bytes, bytes]]:
        self.late.append(self.sent)
        self.sent = []
        return self.late.popleft()


@dataclass
class Worker:
    name: str
    partition: int
    reporter: Reporter
    engine: int = SLOTS
    topic: deque[tuple[int, float, bool]] = field(default_factory=deque)  # offset, s, shared
    running: list[float] = field(default_factory=list)  # finish times (a heap)
    queued: deque[float] = field(default_factory=deque)  # admitted, not on the engine
    position: int = 0
    busy_s: float = 0.0

    def step(self, now: float) -> None:
        while self.running and self.running[0] <= now + 1e-9:
            heapq.heappop(self.running)
        while self.queued and len(self.running) < self.engine:
            heapq.heappush(self.running, now + self.queued.popleft())
        while self.topic and len(self.running) + len(self.queued) < SLOTS:
            offset, request_s, shared = self.topic.popleft()
            self.position = offset + 1
            if not shared:  # a drained record is answered at admission, never run
                continue
            if len(self.running) < self.engine:
                heapq.heappush(self.running, now + request_s)
            else:
                self.queued.append(request_s)
        self.busy_s += len(self.running) * STEP_S
        held = len(self.running) + len(self.queued)
        self.reporter.step(now, {self.partition: self.position}, held, held, SLOTS - held)


class Fleet:
    def __init__(self, workers: int, seed: int = 7, engine: int = SLOTS) -> None:
        self.clock = Clock()
        self.wire = Wire()
        self.credits = Credits(SLOTS, clock=self.clock, wall=self.clock, engine=engine)
        self.workers = [
            Worker(f"w{i}", i, Reporter(f"w{i}", "requests.demand", self.wire), engine)
            for i in range(workers)
        ]
        self.ends = [0] * workers  # each partition's end offset
        self.random = random.Random(seed)
        self.rooms: list[int] = []

    def write(self, partition: int, request_s: float, shared: bool = True) -> None:
        offset = self.ends[partition]
        self.ends[partition] += 1
        self.workers[partition].topic.append((offset, request_s, shared))
        if shared:
            self.credits.delivered(partition, offset)

    def run(self, seconds: float, request_s: float, long_share: float = 0.0) -> None:
        start = self.clock.now
        for step in range(round(seconds / STEP_S)):
            self.clock.now = start + step * STEP_S
            for key, value in self.wire.arrived():
                self.credits.report(decode(key, value))
            room = self.credits.room()
            self.rooms.append(room)
            for partition in self.credits.place(room):
                long = self.random.random() < long_share
                self.write(partition, request_s * (50 if long else 1))
            for w in self.workers:
                w.step(self.clock.now)

    def busy(self) -> float:
        return sum(w.busy_s for w in self.workers)


def utilization(
    workers: int, request_s: float, long_share: float = 0.0, engine: int = SLOTS
) -> float:
    """The share of the fleet's engine slots busy, once the first reports came."""
    fleet = Fleet(workers, engine=engine)
    fleet.run(max(2 * request_s, 3.0), request_s, long_share)  # warm: the first reports
    before, measure_s = fleet.busy(), max(6 * request_s, 20.0)
    fleet.run(measure_s, request_s, long_share)
    return (fleet.busy() - before) / (workers * engine * measure_s)


#: engine batches: all of a worker's slots (the topic holds one batch), and half of them
#: (the defaults, 32 of 64: the worker's queue is the cushion, the topic holds its rate)
ENGINES = [SLOTS, SLOTS // 2]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("request_s", [2.0, 10.0])
def test_five_hundred_workers_keep_capacity(request_s: float, engine: int) -> None:
    assert utilization(500, request_s, engine=engine) >= 0.95


@pytest.mark.parametrize("engine", ENGINES)
def test_five_hundred_workers_keep_capacity_with_five_percent_long_requests(engine: int) -> None:
    assert utilization(500, 2.0, long_share=0.05, engine=engine) >= 0.9


def test_one_worker_with_mixed_lengths_stays_full() -> None:
    """Issue 39's repro: one in-flight worker, 5 % of requests 50× longer. The depth
    limit (fed − committed) stopped feeding behind the first long request: 0.37×."""
    assert utilization(1, 0.2, long_share=0.05) >= 0.95


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("workers", [1, 4])
def test_a_worker_that_answers_every_step_stays_full(workers: int, engine: int) -> None:
    """A request a step (64 answered each 0.1 s): one batch would run dry before the next
    report arrives; the cushion is the worker's answer rate over CUSHION_S."""
    assert utilization(workers, STEP_S, engine=engine) >= 0.95


def test_the_cushion_is_an_engine_batch_beyond_the_workers_queue_or_its_reads() -> None:
    """The topic holds one engine batch less the worker's own queue (its slots beyond an
    engine batch), or what the worker reads in CUSHION_S where its queue holds less than
    that: a full worker that reads nothing is owed a batch when every slot runs, nothing
    when half of them are a queue (the defaults)."""
    full = Demand("w", 1.0, ((0, 0),), held=64, running=64, free=0)
    for engine, cushion in [(None, 64), (64, 64), (48, 32), (32, 0), (8, 0), (1000, 64)]:
        credits = Credits(64, clock=lambda: 1.0, wall=lambda: 1.0, engine=engine)
        credits.report(full)
        assert credits.credits() == {"w": cushion} and credits.cushion(0.0) == cushion
        assert credits.cushion(1000.0) == int(1000 * CUSHION_S)  # beyond any queue
    queued = Credits(64, clock=lambda: 1.0, wall=lambda: 1.0, engine=32)
    assert queued.cushion(64.0) == 0  # 32 read in CUSHION_S: its queue of 32 holds them
    assert queued.cushion(66.0) == 33  # more than its queue holds: all of them
    assert Credits(64, engine=64).cushion(66.0) == 64  # no queue: at least a batch
    clock = Clock()
    fast = Credits(64, clock=clock, wall=clock, engine=32)
    for step in range(21):  # 400 shared records read a second, over 2 s of reports
        clock.now = 1.0 + step * 0.1
        for offset in range(40 * step, 40 * step + 40):
            fast.delivered(0, offset)
        fast.report(Demand("w", clock.now, ((0, 40 * step),), 64, 64, 0))
    assert fast.credits() == {"w": int(400 * CUSHION_S) - 40}  # its last 40 are unread


def test_the_topic_holds_at_most_one_batch_a_worker_ahead() -> None:
    fleet = Fleet(4)
    fleet.run(20.0, 2.0, long_share=0.05)
    for w in fleet.workers:  # what waits for a worker: about one batch (its answers
        # in CUSHION_S, at most 64 ÷ 2 s), not the fleet-wide limit's thousands
        assert len(w.topic) <= 2 * SLOTS


def test_a_long_request_pins_nothing() -> None:
    """One request that runs for ever, thousands answered behind it: credit is unchanged."""
    fleet = Fleet(1)
    fleet.write(0, 1e9)
    fleet.run(30.0, 0.2)
    assert fleet.workers[0].position > 5_000
    assert len(fleet.workers[0].running) == SLOTS  # the long one and 63 others


def test_a_cancel_drain_inflates_nothing() -> None:
    """5,000 drained records (answered 4005 at admission) are neither unread nor read
    shared records: the room after them is what it was (the depth limit went from 128 to
    5,096–8,192)."""
    fleet = Fleet(1)
    fleet.run(10.0, 1.0)
    steady = max(fleet.rooms[-20:])
    for _ in range(5_000):
        fleet.write(0, 1.0, shared=False)
    fleet.rooms.clear()
    fleet.run(10.0, 1.0)
    assert max(fleet.rooms) <= steady
    assert fleet.credits.credits()["w0"] <= 2 * SLOTS


def test_a_worker_that_stops_reporting_loses_its_credit() -> None:
    fleet = Fleet(2)
    fleet.run(5.0, 1.0)
    gone = fleet.workers.pop()
    assert set(fleet.credits.credits()) == {"w0", "w1"}
    fleet.run(STALE_S + 1.0, 1.0)
    assert set(fleet.credits.credits()) == {"w0"}
    assert all(p == 0 for p in fleet.credits.place(1_000))
    assert gone.partition == 1


def test_a_partition_named_by_two_reports_is_held_by_the_newer() -> None:
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    credits.report(Demand("old", 1.0, ((0, 0),), 0, 0, 4))
    credits.report(Demand("new", 2.0, ((0, 0), (1, 0)), 0, 0, 4))
    assert credits.credits() == {"new": 12}
    assert set(credits.place(100)) == {0}  # one partition of it: read in the order fed


def test_a_workers_records_go_to_one_of_its_partitions_in_the_order_fed() -> None:
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    credits.report(Demand("w", 1.0, ((0, 0), (1, 0), (2, 0)), 0, 0, 8))
    assert credits.place(6) == [0] * 6  # not spread over 0, 1, 2
    # unread records on 2 (written before a rebalance, say): the next go behind them
    moved = Credits(8, clock=clock, wall=clock)
    moved.report(Demand("w", 1.0, ((0, 0), (1, 0), (2, 0)), 0, 0, 8))
    moved.delivered(2, 0)
    moved.delivered(2, 1)
    assert moved.place(4) == [2] * 4


def test_a_first_slice_goes_where_the_fewest_records_wait_ahead_of_it() -> None:
    """Answers leave a partition in offset order: a newcomer's records fed beyond credit
    go to the partition where the fewest wait unanswered or unread, not behind the
    worker's queued requests on its shared lane, and the next newcomers follow them there,
    in the order fed, until records fed within credit go there too (§10 (c))."""
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    positions = ((0, 16), (1, 0), (2, 1), (3, 0))
    # 8 running and 8 queued on partition 0; 1 waiting on 2; nothing on 1 and 3
    full = Demand("w", 1.0, positions, 16, 8, 0, ((0, 16), (2, 1)))
    credits.report(full)
    for offset in range(16, 20):  # and four unread on 0: no credit left
        credits.delivered(0, offset)
    assert credits.room() == 0
    assert credits.place(3, over=3) == [1, 1, 1]  # one partition: read in the order fed
    for offset in range(3):
        credits.delivered(1, offset, over=True)
    assert credits.place(2, over=2) == [1, 1]  # behind the last newcomers, not on 3
    for offset in range(3, 5):
        credits.delivered(1, offset, over=True)
    # with room, the shared records go to the lane with the most unread: behind them
    credits.report(Demand("w", 2.0, ((0, 20), (1, 0), (2, 1), (3, 0)), 4, 4, 12, ((0, 4),)))
    assert credits.place(4) == [1] * 4
    # so the next newcomer goes where the fewest wait now, not behind those four
    credits.report(Demand("w", 3.0, ((0, 20), (1, 0), (2, 1), (3, 0)), 16, 8, 0, ((0, 16),)))
    assert credits.place(1, over=1) == [2]


def test_credit_is_free_room_and_a_batch_less_what_waits_and_is_unread() -> None:
    clock = Clock()
    credits = Credits(64, clock=clock, wall=clock)
    credits.report(Demand("w", 1.0, ((3, 10),), held=80, running=60, free=4))
    for offset in range(8, 20):  # two already read, ten unread
        credits.delivered(3, offset)
    assert credits.credits() == {"w": 4 + 64 - 20 - 10}
    assert credits.place(100) == [3] * 38
    assert credits.room() == 0
    credits.report(None, worker="w")
    assert credits.credits() == {}


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"[]",
        b"{}",
        b'{"at":1,"positions":[[0,1]],"held":-1,"running":0,"free":0}',
        b'{"at":1,"positions":[[0,1]],"held":1e400,"running":0,"free":0}',
        b'{"at":1,"positions":[[0]],"held":1,"running":0,"free":0}',
        b'{"at":"x","positions":[],"held":1,"running":0,"free":0}',
        b'{"at":1,"positions":[[0,1]],"held":true,"running":0,"free":0}',
        b'{"at":1,"positions":[[0,1]],"held":1,"running":0,"free":0,"unanswered":[[0]]}',
        b'{"at":1,"positions":[[0,1]],"held":1,"running":0,"free":0,"unanswered":[[0,-3]]}',
        b'{"at":1,"positions":[[0,1]],"held":1,"running":0,"free":0,"unanswered":{"0":1}}',
        b'{"at":1,"positions":[],"held":1,"running":0,"free":0,"unanswered":['
        + b"[0,1]," * 5000
        + b"[0,1]]}",
        b"[" * 50_000,  # nested past the parser's recursion limit, within the size bound
        b'{"at":1,"positions":' + b"[" * 50_000,
        b"\xff" * 10,
        b"{" * 100_000,
        b'{"at":1,"positions":[[0,1]],"held":1,"running":0,"free":0,"flex":0}',
        b'{"at":1,"positions":[[0,1]],"held":1,"running":0,"free":0,"flex":"no"}',
    ],
)
def test_a_bad_report_gives_no_credit(value: bytes) -> None:
    assert decode(b"w", value) is None


def test_reports_round_trip_and_come_when_due() -> None:
    wire = Wire()
    reporter = Reporter("w", "t", wire)
    assert reporter.step(0.0, {1: 5}, 3, 2, 6)
    assert not reporter.step(0.05, {1: 6}, 3, 2, 6)  # within REPORT_S
    assert not reporter.step(0.5, {1: 5}, 3, 2, 6)  # unchanged: only every ALIVE_S
    assert reporter.step(1.0, {1: 5}, 3, 2, 6)
    assert reporter.step(1.2, {1: 5}, 4, 2, 6, wall=1e9)
    key, value = wire.sent[-1]
    assert decode(key, value) == Demand("w", 1e9, ((1, 5),), 4, 2, 6)
    assert reporter.step(1.4, {1: 5}, 4, 2, 6, unanswered={1: 3})  # a change: reported
    key, value = wire.sent[-1]
    assert decode(key, value) == Demand("w", 1.4, ((1, 5),), 4, 2, 6, ((1, 3),))
    # a report from before ``unanswered`` was written says nothing waits
    old = b'{"at":1,"positions":[[1,5]],"held":4,"running":2,"free":6}'
    assert decode(b"w", old) == Demand("w", 1.0, ((1, 5),), 4, 2, 6)
    assert reporter.step(1.6, {1: 5}, 4, 2, 6, flex=False)  # flex held back: a change
    key, value = wire.sent[-1]
    assert decode(key, value) == Demand("w", 1.6, ((1, 5),), 4, 2, 6, (), flex=False)


def test_a_dead_workers_old_report_gives_no_credit() -> None:
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    clock.now = 100.0
    credits.report(Demand("dead", 100.0 - STALE_S - 1, ((0, 0),), 0, 0, 4))
    assert credits.room() == 0


def test_a_report_from_the_future_holds_no_partition() -> None:
    """Anyone can write the demand topic: a report dated far ahead would be the newer
    report of every partition it names, for as long as it is read back."""
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    clock.now = 100.0
    credits.report(Demand("real", 100.0, ((0, 0),), 0, 0, 4))
    credits.report(Demand("forger", 1e300, ((0, 0),), 0, 0, 1 << 40))
    assert credits.credits() == {"real": 12}


def test_flex_room_is_only_on_workers_whose_engine_starts_flex_now() -> None:
    """A worker whose remote server is under pressure reports flex false: its free slots
    (lent by its held-back flex requests) count for the other tiers, not for flex."""
    clock = Clock()
    credits = Credits(8, clock=clock, wall=clock)
    clock.now = 100.0
    credits.report(Demand("quiet", 100.0, ((0, 0),), 0, 0, 4))
    credits.report(Demand("pressed", 100.0, ((1, 0),), 6, 6, 5, flex=False))
    assert credits.room(cushion=False) == 4  # flex: the quiet worker's free slots only
    assert credits.room() == sum(credits.credits().values()) >= 4 + 5
