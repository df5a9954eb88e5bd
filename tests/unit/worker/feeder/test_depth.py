"""The feeder's depth limit keeps a fleet busy whatever a request takes (issue 33, item 1).

A fake-clock fleet drives the real :class:`~worker.feeder.depth.Depth`: ``workers``
workers, each owning one partition of the requests topic and running up to
``prefetch`` requests at a time for ``request_s`` each (continuous batching), committing
what they answered every 100 ms. The feeder feeds whatever ``room()`` allows. Before
issue 33 the limit was ``answered/s × 1 s``: at 2 s a request 50 × 64 workers got
57 requests/s of 1,600.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from confluent_kafka import TopicPartition

from worker.config import SchedulingConfig
from worker.feeder.depth import PARTITIONS_EVERY_S, Depth

STEP_S = 0.02
COMMIT_S = 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Worker:
    """One worker and its one partition."""

    queue: deque[int] = field(default_factory=deque)  # fed offsets not fetched yet
    running: deque[tuple[int, int]] = field(default_factory=deque)  # (finish step, offset)
    answered_to: int = 0  # every offset below it was answered
    committed: int = 0
    next_offset: int = 0

    def step(self, now: int, prefetch: int, steps: int) -> int:
        """Step ``now``: answer what finished, take what fits (a request takes ``steps``)."""
        done = 0
        while self.running and self.running[0][0] <= now:
            _, offset = self.running.popleft()
            self.answered_to = offset + 1  # FIFO with one request time: in order
            done += 1
        while self.queue and len(self.running) < prefetch:
            self.running.append((now + steps, self.queue.popleft()))
        return done


class Fleet:
    def __init__(self, workers: int) -> None:
        self.workers = [Worker() for _ in range(workers)]

    def committed(
        self, partitions: list[TopicPartition], timeout: float = 0
    ) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.workers[tp.partition].committed)
            for tp in partitions
        ]


def simulate(
    workers: int, prefetch: int, request_s: float, warm_s: float, measure_s: float
) -> tuple[float, int]:
    """(answered requests/s ÷ capacity over the measured window, the largest depth limit)."""
    clock, fleet = Clock(), Fleet(workers)
    depth = Depth(fleet, "requests", workers, SchedulingConfig(), prefetch, clock=clock)
    fed = answered = answered_at_warm = highest = 0
    steps, commit_every = round(request_s / STEP_S), round(COMMIT_S / STEP_S)
    for step in range(round((warm_s + measure_s) / STEP_S)):
        clock.now = step * STEP_S  # whole steps: no drift in a request's time
        if step == round(warm_s / STEP_S):
            answered_at_warm = answered
        room = depth.room()
        highest = max(highest, depth.limit)
        if room > 0:
            for _ in range(room):
                worker = fleet.workers[fed % workers]
                worker.queue.append(worker.next_offset)
                depth.delivered(fed % workers, worker.next_offset)
                worker.next_offset += 1
                fed += 1
            depth.fed(room)
        for worker in fleet.workers:
            answered += worker.step(step, prefetch, steps)
        if step % commit_every == 0:
            for worker in fleet.workers:
                worker.committed = worker.answered_to
    capacity = workers * prefetch / request_s
    return (answered - answered_at_warm) / measure_s / capacity, highest


@pytest.mark.parametrize("request_s", [0.1, 2.0, 8.0])
def test_fifty_workers_keep_nine_tenths_of_capacity(request_s: float) -> None:
    warm = 60 + 25 * request_s  # the limit grows from min_depth about 1.5× a round trip
    share, highest = simulate(50, 64, request_s, warm, max(60.0, 40 * request_s))
    assert share >= 0.9, f"{share:.2f} of capacity at {request_s} s a request"
    # and no deeper than the fleet needs: 50 × 64 running, as many waiting, and a
    # round trip's commits
    assert highest <= 8192


def test_a_lone_worker_is_fed_about_twice_what_it_holds() -> None:
    """The bound that makes fair share work: a newcomer waits behind about two round trips
    of the fleet's work, not a fixed second of it."""
    share, _ = simulate(1, 64, 2.0, 60.0, 60.0)
    assert share >= 0.9
    clock, fleet = Clock(), Fleet(1)
    depth = Depth(fleet, "requests", 1, SchedulingConfig(), 64, clock=clock)
    assert depth.room() == 128  # nothing measured yet: min_depth, 2 × prefetch


class Committed:
    """The worker group's committed offsets, by partition."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    def committed(
        self, partitions: list[TopicPartition], timeout: float = 0
    ) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.offsets.get(tp.partition, -1001))
            for tp in partitions
        ]


def test_partitions_added_to_the_requests_topic_are_counted_without_a_restart() -> None:
    """Issue 38: Depth fixed its partitions when the mover was built, so what it fed to a
    new partition never counted as committed: the depth only grew and feeding stopped."""
    clock, committed, partitions = Clock(), Committed(), [2]
    depth = Depth(committed, "requests", 2, SchedulingConfig(), 64, clock, lambda: partitions[0])
    partitions[0] = 3  # an operator adds a partition
    for offset in range(100):
        depth.delivered(2, offset)  # fed to the new partition
    depth.fed(100)
    committed.offsets[2] = 100  # and the workers answered it all
    clock.now += 1.0
    depth.room()
    assert depth.depth == 100  # not counted yet: within PARTITIONS_EVERY_S
    clock.now += PARTITIONS_EVERY_S
    depth.room()
    assert depth.depth == 0
