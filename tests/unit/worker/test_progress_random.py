"""Ownership changes at random while answers finish out of order (issue 48).

Two workers with the real transactional publisher on one in-memory broker: answers are
published as they complete, above their partition's committed offset, and partitions move
between the workers (eager rebalances: everything revoked, then assigned anew), are lost
without a last commit, and have transactions aborted and done again, while long requests
hold their partitions' offsets back. Counted on what a read_committed reader of the results
topic sees (``broker.sent``), never after a dedup: every record answered exactly once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial

import pytest
from confluent_kafka import KafkaError

from batcher import Partition
from worker.loop.service import Worker

from .fakes import FakeBroker, FakeClients, GatedInFlightEngine
from .rig import RESULTS, TOPIC, Rig, loop_config

PARTITIONS = 3
REQUESTS = 36
ABORTABLE = KafkaError(KafkaError.INVALID_TXN_STATE, "abortable", txn_requires_abort=True)


@contextmanager
def member(broker: FakeBroker) -> Iterator[Rig[GatedInFlightEngine]]:
    config = loop_config(prefetch_count=6, max_batch_size=3)
    clients = FakeClients(config.kafka, broker, "exactly_once")
    engine = GatedInFlightEngine(gated=False, max_sequences=4)
    r = Rig(Worker(config, engine, clients), broker, clients.fake_consumer, engine)
    r.start()
    try:
        yield r
    finally:
        engine.open()
        r.worker._shutdown()


def owned(r: Rig[GatedInFlightEngine]) -> list[Partition]:
    return [(tp.topic, tp.partition) for tp in r.consumer.assignment()]


def serve(members: list[Rig[GatedInFlightEngine]]) -> None:
    """Step every member until its queued rebalance events are served."""
    for r in members:
        r.step_until(partial(_served, r), "the rebalance served")


def _served(r: Rig[GatedInFlightEngine]) -> bool:
    return not r.consumer.rebalancing


def reassign(members: list[Rig[GatedInFlightEngine]], rng: random.Random, lost: bool) -> None:
    """An eager rebalance: every member gives up everything (or loses it), then the
    partitions are dealt anew."""
    for r in members:
        if owned(r):
            r.consumer.rebalance("lost" if lost else "revoke", owned(r))
    serve(members)
    deal: dict[int, list[Partition]] = {0: [], 1: []}
    for number in range(PARTITIONS):
        deal[rng.randrange(2)].append((TOPIC, number))
    for index, r in enumerate(members):
        if deal[index]:
            r.consumer.rebalance("assign", deal[index])
    serve(members)


@pytest.mark.parametrize("seed", range(30))
def test_every_record_is_answered_once_through_random_ownership_changes(seed: int) -> None:
    rng = random.Random(seed)
    broker = FakeBroker(TOPIC, PARTITIONS)
    slow = {f"r{i}" for i in range(REQUESTS) if rng.random() < 0.25}
    for i in range(REQUESTS):
        broker.submit(
            rng.randrange(PARTITIONS), f"r{i}", f"slow {i}" if f"r{i}" in slow else f"x{i}"
        )
    with ExitStack() as stack:
        members = [stack.enter_context(member(broker)) for _ in range(2)]
        for r in members:
            r.engine.stragglers.update(f"slow {i}" for i in range(REQUESTS))
        reassign(members, rng, lost=False)
        for _ in range(12):
            for _ in range(rng.randint(1, 6)):
                for r in members:
                    r.worker._step(draining=False)
            event = rng.random()
            if event < 0.35:
                reassign(members, rng, lost=rng.random() < 0.3)
            elif event < 0.6:
                release = rng.sample(sorted(slow), k=min(len(slow), 2))
                for r in members:
                    r.engine.stragglers.difference_update(f"slow {x[1:]}" for x in release)
            elif event < 0.75:
                broker.fail("commit_transaction", ABORTABLE)
        for r in members:
            r.engine.stragglers.clear()
        ids = {f"r{i}" for i in range(REQUESTS)}

        def settled() -> bool:
            for r in members:
                r.worker._step(draining=False)
            logs = broker.logs
            return (
                set(broker.answers(RESULTS)) >= ids
                and all(len(r.worker.ledger) == 0 for r in members)
                and all(broker.committed.get(p, 0) == len(log) for p, log in logs.items())
            )

        members[0].step_until(settled, "every record answered and committed")
        assert broker.answers(RESULTS) == Counter(dict.fromkeys(ids, 1)), f"seed {seed}"
