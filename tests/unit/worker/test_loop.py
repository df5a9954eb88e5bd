"""The worker loop against in-memory Kafka: rebalances during a batch, poison, hangs.

Each test steps ``Worker._step`` until a condition holds (bounded by ``rig.WAIT_S``); the
gated engine keeps a batch "on the engine" until the test opens it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from worker.errors import ErrorCode
from worker.loop.service import EXIT_OK, EXIT_WEDGED, Worker

from .fakes import FakeBroker, FakeClients, GatedEngine, RebalanceKind
from .rig import P0, P1, RESULTS, TOPIC, WAIT_S, Rig, loop_config, rig


def submit(r: Rig[Any], partitions: int = 2, per_partition: int = 2) -> set[str]:
    """``per_partition`` requests on each partition; their custom_ids."""
    ids = set()
    for p in range(partitions):
        for i in range(per_partition):
            r.broker.submit(p, f"p{p}-{i}", f"hello {p} {i}")
            ids.add(f"p{p}-{i}")
    return ids


@pytest.mark.parametrize("kind", ["revoke", "lost"])
def test_answers_of_a_batch_revoked_on_the_engine_are_not_published(kind: RebalanceKind) -> None:
    with rig(loop_config(), GatedEngine()) as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "a batch on the engine")
        assert len(r.engine.batches[0]) == 4
        r.consumer.rebalance(kind, [P0, P1])
        r.step_until(lambda: not r.consumer.rebalancing, "the rebalance")
        assert len(r.worker.ledger) == 0 and len(r.worker.batcher) == 0

        r.engine.open()
        r.step_until(lambda: not r.worker.engine_stage.busy, "the old batch to finish")
        assert r.answers() == Counter()
        assert r.broker.committed == {}

        # the worker goes on: assigned again, it reads the records again and answers them
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_a_partition_back_while_its_old_batch_runs_gets_each_record_answered_once() -> None:
    with rig(loop_config(), GatedEngine()) as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "a batch on the engine")
        r.consumer.rebalance("revoke", [P0, P1])
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.worker.batcher) == 4, "the records read again")
        assert r.worker.engine_stage.busy, "the old batch should still be on the engine"

        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert len(r.engine.batches) == 2  # the old run and the new one


def test_split_and_retry_fails_only_the_poison_request() -> None:
    prompts = {"r0": "alpha", "r1": "beta", "r2": "poison", "r3": "gamma"}
    with rig(loop_config(), GatedEngine(gated=False, poison="poison")) as r:
        for custom_id, prompt in prompts.items():
            r.broker.submit(0, custom_id, prompt)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(set(prompts)), "every record answered and committed")

        results = {result.custom_id: result for result in r.results()}
        assert len(r.results()) == len(prompts)
        poisoned = results.pop("r2")
        assert poisoned.status == "failed" and poisoned.error is not None
        assert poisoned.error.code == ErrorCode.ENGINE_FAILED
        assert {i: (res.status, res.text) for i, res in results.items()} == {
            i: ("completed", prompts[i]) for i in results
        }
        # the whole batch, then the half holding the poison, then the poison alone
        assert [len(b) for b in r.engine.batches if "poison" in b] == [4, 2, 1]


def test_a_hung_engine_wedges_the_worker_which_leaves_and_the_next_owner_answers() -> None:
    config = loop_config(engine_timeout_s=0.2, max_batch_size=2)
    broker = FakeBroker(TOPIC, 1)
    for i in range(4):
        broker.submit(0, f"r{i}", f"hello {i}")
    ids = {f"r{i}" for i in range(4)}
    hung = FakeClients(config.kafka, broker)
    hung.fake_consumer.rebalance("assign", [P0])
    engine = GatedEngine()  # never opened while the worker runs: the engine hangs
    worker = Worker(config, engine, hung)
    try:
        assert run(worker) == EXIT_WEDGED
        liveness = worker.health.liveness()
        assert not liveness.alive and "engine_timeout_s=0.2" in liveness.reason
        assert worker.health.readiness().failing == ("model",)
    finally:
        engine.open()
    assert hung.fake_consumer.closed  # left the group: its partitions go to another member
    # the hung batch is answered 5000 and committed; what waited behind it is not answered
    (batch,) = engine.batches
    results = broker.results(RESULTS)
    assert {(r.custom_id, r.error.code if r.error else None) for r in results} == {
        (f"r{prompt.split()[1]}", ErrorCode.ENGINE_FAILED) for prompt in batch
    }
    assert broker.committed == {P0: 2}

    # the next owner (a fresh process) answers the rest, each request once in all
    nxt = FakeClients(config.kafka, broker)
    nxt.fake_consumer.rebalance("assign", [P0])
    successor = Worker(config, GatedEngine(gated=False), nxt)
    exit_code = run(successor, until=lambda: set(broker.answers(RESULTS)) == ids)
    assert exit_code == EXIT_OK
    assert broker.answers(RESULTS) == Counter(dict.fromkeys(ids, 1))
    assert broker.committed == {P0: 4}


def run(worker: Worker, until: Callable[[], bool] | None = None) -> int:
    """``worker.run()`` on a thread; stopped (SIGTERM) once ``until()`` holds, if given."""
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(worker.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while until is not None and not until():
        assert time.monotonic() < deadline, "gave up waiting for the worker"
        time.sleep(0.001)
    if until is not None:
        worker.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the worker did not exit"
    return exit_codes[0]
