"""Newcomers first on a fake clock: a small batch submitted behind a large one.

The fleet of :mod:`test_credits` (the real :class:`~worker.demand.Reporter` and
:class:`~worker.feeder.credits.Credits`, reports 0.3 s late) with the feeder's real
:class:`~batcher.fairshare.FairShare` choosing what to feed, and workers that hold what
they admit in the real :class:`~batcher.batcher.DynamicBatcher`: ``PREFETCH`` requests
admitted, ``SLOTS`` of them on the engine (an in-flight engine), the rest queued.

A large batch (alice) keeps every worker's credit spent; a small one (bob) arrives 20 s
in. With newcomers first its first slice is fed at once, beyond credit, and each worker
starts bob's requests before the requests it already queued (their tags are higher).
What neither can skip is what the requests topic already holds for a worker, about one
batch (the credit's cushion) ahead of bob's records in each partition: a Kafka partition
is read in order. So the bound is honest: bob completes within his time alone plus the
time a worker takes to read one batch, ``PREFETCH ÷ (SLOTS ÷ request time)``, plus a
report's lag; the same fleet without newcomers first (no overdraw, arrival order in the
worker) waits for the queued requests as well.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import pytest

from batcher import BatchLimits, DynamicBatcher, Pending
from batcher.fairshare import FairShare
from tests.unit.worker.feeder.test_credits import LAG_STEPS, STEP_S, Clock, Wire
from worker.demand import Reporter, decode
from worker.feeder.credits import Credits

PREFETCH = 64
SLOTS = 32
REQUEST_S = 1.0
LIMITS = BatchLimits(max_batch_size=PREFETCH, max_batch_tokens=1 << 20, timeout_s=0.0)


@dataclass
class Worker:
    partition: int
    reporter: Reporter
    tags: bool
    topic: deque[tuple[str, float]] = field(default_factory=deque)  # (custom id, tag)
    queue: DynamicBatcher[None] = field(default_factory=lambda: DynamicBatcher(LIMITS))
    running: list[tuple[float, str]] = field(default_factory=list)  # (finish, id), a heap
    position: int = 0

    def step(self, now: float, done: dict[str, float]) -> None:
        while self.running and self.running[0][0] <= now + 1e-9:
            _, key = heapq.heappop(self.running)
            self.queue.complete(key)
            done[key] = now
        while self.topic and self.queue.in_flight() < PREFETCH:  # admission: PREFETCH slots
            key, tag = self.topic.popleft()
            self.position += 1
            item = Pending(key, ("requests", self.partition), self.position, 1, 1, now, None)
            if self.tags:
                item = Pending(key, item.partition, item.offset, 1, 1, now, None, tag=tag)
            self.queue.add(item, now)
        room = SLOTS - len(self.running)
        batch = self.queue.take(now, room, LIMITS.max_batch_tokens, flush=True) if room else None
        for item in batch.items if batch else ():
            heapq.heappush(self.running, (now + REQUEST_S, item.key))
        admitted = self.queue.in_flight()
        self.reporter.step(
            now, {self.partition: self.position}, admitted, admitted, PREFETCH - admitted
        )


class Fleet:
    def __init__(self, workers: int, newcomers_first: bool) -> None:
        self.clock = Clock()
        self.wire = Wire()
        self.credits = Credits(PREFETCH, clock=self.clock, wall=self.clock)
        self.fair = FairShare(16)
        self.fresh = PREFETCH if newcomers_first else 0
        self.workers = [
            Worker(i, Reporter(f"w{i}", "requests.demand", self.wire), newcomers_first)
            for i in range(workers)
        ]
        self.ends = [0] * workers  # each partition's end offset
        self.waiting: dict[str, deque[str]] = {}
        self.submitted: dict[str, float] = {}
        self.done: dict[str, float] = {}

    def submit(self, batch: str, count: int) -> None:
        self.waiting[batch] = deque(f"{batch}{n}" for n in range(count))
        self.submitted[batch] = self.clock.now
        self.fair.add(batch, count, key=batch)

    def step(self) -> None:
        for key, value in self.wire.arrived():
            self.credits.report(decode(key, value))
        room = self.credits.room()
        fresh = self.fresh if self.credits.live() else 0
        fed: list[tuple[str, float]] = []
        while (picked := self.fair.next(room, fresh)) is not None:
            batch, count = picked
            start, per = self.fair.tag, self.fair.tag_step  # each request its own tag
            fed.extend((self.waiting[batch].popleft(), start + k * per) for k in range(count))
            room = max(0, room - count)
        partitions = self.credits.place(len(fed), over=len(fed))
        for (custom_id, tag), partition in zip(fed, partitions, strict=True):
            self.workers[partition].topic.append((custom_id, tag))
            self.credits.delivered(partition, self.ends[partition])
            self.ends[partition] += 1
        for w in self.workers:
            w.step(self.clock.now, self.done)
        self.clock.now += STEP_S

    def completed_in(self, batch: str, count: int) -> float:
        ends = [self.done[f"{batch}{n}"] for n in range(count) if f"{batch}{n}" in self.done]
        assert len(ends) == count, f"{batch}: {len(ends)} of {count} done"
        return max(ends) - self.submitted[batch]


def small_batch_time(behind_large: bool, newcomers_first: bool, workers: int = 4) -> float:
    fleet = Fleet(workers, newcomers_first)
    for _ in range(round(3.0 / STEP_S)):  # the first reports
        fleet.step()
    if behind_large:
        fleet.submit("alice", 5_000)
        for _ in range(round(20.0 / STEP_S)):
            fleet.step()
    fleet.submit("bob", 10)
    for _ in range(round(30.0 / STEP_S)):
        fleet.step()
    return fleet.completed_in("bob", 10)


@pytest.mark.parametrize("workers", [1, 4])
def test_a_small_batch_behind_a_large_one_waits_one_read_batch_at_most(workers: int) -> None:
    alone = small_batch_time(False, True, workers)
    first = small_batch_time(True, True, workers)
    fifo = small_batch_time(True, False, workers)
    read_one_batch = PREFETCH / (SLOTS / REQUEST_S)
    lag = (LAG_STEPS + 2) * STEP_S  # a report's way to the feeder, and a step each side
    assert first <= alone + read_one_batch + lag
    assert first < fifo
