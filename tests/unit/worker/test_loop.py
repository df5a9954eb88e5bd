"""The worker loop against in-memory Kafka: rebalances during a batch, poison, hangs.

Each test steps ``Worker._step`` until a condition holds (bounded by ``rig.WAIT_S``); the
gated engine keeps a batch "on the engine" until the test opens it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from worker.errors import ErrorCode

from .fakes import GatedEngine, RebalanceKind
from .rig import P0, P1, Rig, loop_config, rig


def submit(r: Rig, partitions: int = 2, per_partition: int = 2) -> set[str]:
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


def test_an_engine_hang_fails_its_batch_and_the_worker_goes_not_ready() -> None:
    with rig(loop_config(engine_timeout_s=0.2), GatedEngine()) as r:
        ids = submit(r, partitions=1)
        r.consumer.rebalance("assign", [P0])
        r.step_until(r.engine.entered.is_set, "a batch on the engine")
        assert r.worker.health.readiness().ready

        r.step_until(lambda: set(r.answers()) == ids, "the hung batch answered")
        assert {(res.status, res.error.code if res.error else None) for res in r.results()} == {
            ("failed", ErrorCode.ENGINE_FAILED)
        }
        readiness = r.worker.health.readiness()
        assert readiness.failing == ("model",)
        assert "engine_timeout_s" in readiness.checks["model"].reason

        # a wedged engine takes no new batch
        r.broker.submit(0, "later", "later")
        r.step_until(lambda: len(r.worker.batcher) == 1, "the new record read")
        for _ in range(20):
            r.worker._step(draining=False)
        assert len(r.engine.batches) == 1
        assert "later" not in r.answers()
