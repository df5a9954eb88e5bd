"""Newcomers first on a fake clock: a small batch submitted behind a large one.

The fleet of :mod:`test_credits` (the real :class:`~worker.feeder.demand.Reporter` and
:class:`~worker.feeder.credits.Credits`, reports 0.3 s late) with the feeder's real
:class:`~batcher.fairshare.FairShare` choosing what to feed, and workers that hold what
they admit in the real :class:`~batcher.batcher.DynamicBatcher`: ``PREFETCH`` requests
admitted, ``SLOTS`` of them on the engine (an in-flight engine), the rest queued.

A large batch (alice) keeps every worker's credit spent; a small one (bob) arrives 20 s
in. With newcomers first its first slice is fed at once, beyond credit, and each worker
starts bob's requests before the requests it already queued (their tags are higher).
What neither can skip is what the requests topic already holds for a worker ahead of
bob's records (a Kafka partition is read in order): the credit's cushion, nothing here
(``SLOTS`` of ``PREFETCH`` on the engine: the rest is the worker's own queue, which holds
more than it reads in ``CUSHION_S``). So bob completes within his time
alone plus one request (a slot to free) and a report's lag: 1.0 s, as alone; with a
cushion of one ``PREFETCH`` it was 3.0 s, and without newcomers first (no overdraw,
arrival order in the worker) 2.0 s (4.0 s with that cushion).

Batches that become active together are each fed a first slice of a share of one engine
batch, written a request of each in turn (:meth:`FairShare.first_slice`,
:func:`~worker.feeder.plan.in_tag_order`): four of them get their first answers within
one request of each other, where whole slices written one after another started them
one after another.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import pytest

from batcher import BatchLimits, DynamicBatcher, Pending
from batcher.fairshare import FairShare
from tests.unit.worker.feeder.test_credits import LAG_STEPS, STEP_S, Clock, Wire
from worker.feeder.credits import Credits
from worker.feeder.demand import Reporter, decode
from worker.feeder.plan import in_tag_order

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
    def __init__(
        self, workers: int, newcomers_first: bool, together: bool = True, quantum: int = 16
    ) -> None:
        self.clock = Clock()
        self.wire = Wire()
        self.credits = Credits(PREFETCH, clock=self.clock, wall=self.clock, engine=SLOTS)
        self.fair = FairShare(quantum)
        self.fresh = PREFETCH if newcomers_first else 0
        self.together = together  # first slices share an engine batch, fed in tag order
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
        fresh = min(self.fresh, self.credits.overdraft()) if self.credits.live() else 0
        first = self.fair.first_slice(SLOTS) if self.together else None
        slices: list[tuple[tuple[float, float], list[str]]] = []
        while (picked := self.fair.next(room, fresh, first)) is not None:
            batch, count = picked
            ids = [self.waiting[batch].popleft() for _ in range(count)]
            slices.append(((self.fair.tag, self.fair.tag_step), ids))  # each its own tag
            fresh -= max(0, count - room)
            room = max(0, room - count)
        if self.together:
            fed = in_tag_order(slices)
        else:  # slice after slice
            fed = [(i, start + k * per) for (start, per), ids in slices for k, i in enumerate(ids)]
        partitions = self.credits.place(len(fed), over=len(fed))
        for (custom_id, tag), partition in zip(fed, partitions, strict=True):
            self.workers[partition].topic.append((custom_id, tag))
            self.credits.delivered(partition, self.ends[partition])
            self.ends[partition] += 1
        for w in self.workers:
            w.step(self.clock.now, self.done)
        self.clock.now += STEP_S

    def first_answer(self, batch: str, count: int) -> float:
        return min(self.done[f"{batch}{n}"] for n in range(count)) - self.submitted[batch]

    def completed_in(self, batch: str, count: int) -> float:
        ends = [self.done[f"{batch}{n}"] for n in range(count) if f"{batch}{n}" in self.done]
        assert len(ends) == count, f"{batch}: {len(ends)} of {count} done"
        return max(ends) - self.submitted[batch]


def running(fleet: Fleet, behind_large: bool) -> Fleet:
    """``fleet`` after its first reports, and 20 s of alice's 5,000 when ``behind_large``."""
    for _ in range(round(3.0 / STEP_S)):
        fleet.step()
    if behind_large:
        fleet.submit("alice", 5_000)
        for _ in range(round(20.0 / STEP_S)):
            fleet.step()
    return fleet


def small_batch_time(behind_large: bool, newcomers_first: bool, workers: int = 4) -> float:
    fleet = running(Fleet(workers, newcomers_first), behind_large)
    fleet.submit("bob", 10)
    for _ in range(round(30.0 / STEP_S)):
        fleet.step()
    return fleet.completed_in("bob", 10)


#: scheduling.quantum's default: a slice is 64 requests, two engine batches here
QUANTUM = 64
#: a report's way to the feeder, and a step each side
LAG_S = (LAG_STEPS + 2) * STEP_S


@pytest.mark.parametrize("workers", [1, 4])
def test_a_small_batch_behind_a_large_one_waits_for_a_slot_at_most(workers: int) -> None:
    alone = small_batch_time(False, True, workers)
    first = small_batch_time(True, True, workers)
    fifo = small_batch_time(True, False, workers)
    assert first <= alone + REQUEST_S + LAG_S
    assert first < fifo


def first_answers(together: bool, behind_large: bool, workers: int) -> list[float]:
    """Four batches of 80 submitted in one step: each one's first answer, after it."""
    fleet = running(Fleet(workers, True, together, quantum=QUANTUM), behind_large)
    names = [f"c{k}-" for k in range(4)]
    for name in names:
        fleet.submit(name, 80)
    for _ in range(round(60.0 / STEP_S)):
        fleet.step()
    return [fleet.first_answer(name, 80) for name in names]


@pytest.mark.parametrize("behind_large", [False, True])
@pytest.mark.parametrize("workers", [1, 4])
def test_batches_submitted_together_get_their_first_answers_together(
    workers: int, behind_large: bool
) -> None:
    firsts = first_answers(True, behind_large, workers)
    assert max(firsts) - min(firsts) <= REQUEST_S + LAG_S


@pytest.mark.parametrize("behind_large", [False, True])
def test_whole_first_slices_one_after_another_started_them_apart(behind_large: bool) -> None:
    """What the test above guards against: bench.fairness's four batches on one worker
    at 1 s a step got their first answers a slice (8 s) apart, each first slice (a
    quantum, 64) written as one run of records; here 3–4 requests apart."""
    whole = first_answers(False, behind_large, 1)
    assert max(whole) - min(whole) >= 2 * REQUEST_S
