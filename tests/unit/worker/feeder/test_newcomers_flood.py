"""Newcomers first cannot flood (docs/architecture.md §10, review s4 #1): each newly
active batch may have its first slice fed beyond credit, but what is fed beyond credit
and still unread is at most one batch (``prefetch_count``) a worker, over all of them.

Before, every batch never served overdrew on its own: a tenant splitting its work into
1,000 batches of 10 had nearly all of it fed on a fleet with no credit left, ahead of
everyone else's records on partitions read in order."""

from __future__ import annotations

from typing import cast

import pytest
from confluent_kafka import Message

from tests.unit.worker.fakes import FakeMessage
from tests.unit.worker.feeder.test_quarantine import Feeder
from worker.feeder.credits import Credits
from worker.feeder.demand import Demand
from worker.feeder.naming import pending_headers, tokens_header

PREFETCH = 64
WORKERS = 4
BATCHES, SIZE = 1_000, 10
STEP_MAX = 512  # the mover's budget a step


def small_batches(same_key: bool) -> list[Message]:
    return [
        cast(
            Message,
            FakeMessage(
                ("pending", 0),
                b * SIZE + n,
                f"id-{b}-{n}".encode(),
                b"v" * 40,
                [*pending_headers(f"b{b}", 1.0, "k" if same_key else f"b{b}"), tokens_header(9)],
            ),
        )
        for b in range(BATCHES)
        for n in range(SIZE)
    ]


class FullFleet:
    """Workers whose engines are full and who hold a batch each, unread: no credit."""

    def __init__(self) -> None:
        self.credits = Credits(PREFETCH, clock=lambda: 1.0, wall=lambda: 1.0)
        self.ends = [0] * WORKERS  # each partition's end offset
        self.read = [0] * WORKERS  # each worker's position
        self.report()
        for w in range(WORKERS):
            for _ in range(PREFETCH):
                self.credits.delivered(w, self.ends[w])
                self.ends[w] += 1

    def report(self) -> None:
        for w in range(WORKERS):
            demand = Demand(f"w{w}", 1.0, ((w, self.read[w]),), PREFETCH, PREFETCH, 0)
            self.credits.report(demand)

    def feed(self, feeder: Feeder) -> list[int]:
        """One feed step as the mover takes it; returns per worker how many went beyond."""
        room = self.credits.room()
        step = feeder.planner.plan(room, STEP_MAX, self.credits.overdraft())
        over = max(0, step.shared - room)
        placed = self.credits.place(step.shared, over=over)
        assert len(placed) == step.shared  # every record fed has a place
        beyond = [0] * WORKERS
        for _, _, partition, fed_over in step.written(placed, self.credits.beyond, over):
            assert partition is not None
            self.credits.delivered(partition, self.ends[partition], over=fed_over)
            self.ends[partition] += 1
            beyond[partition] += fed_over
        return beyond

    def read_all(self) -> None:
        """The workers read everything fed so far (their engines stay full)."""
        self.read = list(self.ends)
        self.report()


@pytest.mark.parametrize("same_key", [False, True], ids=["own keys", "one key"])
def test_a_thousand_new_small_batches_overdraw_one_batch_a_worker_at_most(
    same_key: bool,
) -> None:
    records = small_batches(same_key)
    feeder = Feeder(records)
    feeder.planner.note(records)
    fleet = FullFleet()
    assert fleet.credits.room() == 0
    unread = [0] * WORKERS
    for _ in range(20):  # the workers read nothing: the overdraft stays outstanding
        for w, n in enumerate(fleet.feed(feeder)):
            unread[w] += n
        assert all(n <= PREFETCH for n in unread), unread
    assert sum(unread) == WORKERS * PREFETCH  # newcomers first still feeds them...
    assert fleet.feed(feeder) == [0] * WORKERS  # ...and then no more until read
    fleet.read_all()  # read: released, one batch a worker again
    assert fleet.feed(feeder) == [PREFETCH] * WORKERS
    assert fleet.credits.overdraft() == 0
