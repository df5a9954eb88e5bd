"""The worker loop feeding an in-flight engine, against in-memory Kafka.

Revokes while requests are in flight, a partition coming back while its old requests still
run, a hung or broken engine. The gated in-flight engine holds what was submitted until the
test opens it. Backpressure and the SIGTERM drain run on both feeding modes in
``test_flow.py``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from batcher.tiers import FLEX_TAG
from worker.errors import ErrorCode
from worker.feeder.headers import TAG_HEADER
from worker.loop.inflight_stage import InFlightStage
from worker.wire.codec import encode_request
from worker.wire.messages import InferenceRequest

from .fakes import GatedInFlightEngine, RebalanceKind
from .rig import P0, P1, TOPIC, Rig, loop_config, rig
from .test_loop import submit


def of(partition: int, keys: list[str]) -> list[str]:
    """The engine keys (``topic/partition/offset#generation``) of one partition."""
    return [k for k in keys if k.startswith(f"{TOPIC}/{partition}/")]


def test_the_in_flight_stage_serves_an_in_flight_engine() -> None:
    with rig(loop_config(), GatedInFlightEngine(gated=False)) as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert isinstance(r.worker.engine_stage, InFlightStage)
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert all(res.status == "completed" and res.batch_size >= 1 for res in r.results())


def test_no_more_than_max_batch_size_requests_are_in_flight() -> None:
    with rig(loop_config(prefetch_count=16, max_batch_size=3), GatedInFlightEngine()) as r:
        ids = submit(r, per_partition=4)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.worker.ledger) == 8, "every record read")
        for _ in range(10):
            r.worker._step(draining=False)
        assert len(r.engine.running) == 3  # the budget, though the engine has room for 64
        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")


@pytest.mark.parametrize("kind", ["revoke", "lost"])
def test_a_revoked_partition_is_aborted_in_the_engine_and_answered_once_later(
    kind: RebalanceKind,
) -> None:
    with rig(loop_config(), GatedInFlightEngine()) as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.running) == 4, "four requests in flight")
        old_p0 = of(0, r.engine.submitted)
        r.consumer.rebalance(kind, [P0])
        r.step_until(lambda: not r.consumer.rebalancing, "the rebalance")
        assert sorted(r.engine.aborted) == sorted(old_p0)
        assert sorted(r.engine.running) == sorted(of(1, r.engine.submitted))

        r.engine.open()
        p1 = {i for i in ids if i.startswith("p1")}
        r.step_until(lambda: set(r.answers()) == p1, "the partition kept answered")
        assert r.broker.committed.get(P0) is None  # nothing of it was answered here

        r.consumer.rebalance("assign", [P0])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        new_p0 = [k for k in of(0, r.engine.submitted) if k not in old_p0]
        assert len(new_p0) == 2  # read again: a new consumption with a key of its own


def test_a_partition_back_while_its_old_requests_run_never_meets_them() -> None:
    # an engine that completes aborted requests anyway: the worker must still answer once
    with rig(loop_config(), GatedInFlightEngine(late_aborts=True)) as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.running) == 4, "four requests in flight")
        r.consumer.rebalance("revoke", [P0, P1])
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.submitted) == 8, "the records submitted again")
        assert len(r.engine.running) == 8  # the old runs are still in the engine
        old, new = r.engine.submitted[:4], r.engine.submitted[4:]
        assert sorted(r.engine.aborted) == sorted(old)
        assert not set(old) & set(new)
        assert sorted(k.split("#")[0] for k in old) == sorted(k.split("#")[0] for k in new)

        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_an_engine_without_progress_fails_its_requests_and_wedges_the_worker() -> None:
    with rig(loop_config(engine_timeout_s=0.2), GatedInFlightEngine()) as r:
        ids = submit(r, partitions=1)
        r.consumer.rebalance("assign", [P0])
        r.step_until(r.engine.entered.is_set, "requests in flight")
        assert r.worker.health.readiness().ready

        r.step_until(lambda: set(r.answers()) == ids, "the hung requests answered")
        assert {(res.status, res.error.code if res.error else None) for res in r.results()} == {
            ("failed", ErrorCode.ENGINE_FAILED)
        }
        readiness = r.worker.health.readiness()
        assert readiness.failing == ("model",)
        assert "engine_timeout_s" in readiness.checks["model"].reason
        assert sorted(r.engine.aborted) == sorted(r.engine.submitted)
        assert r.worker.engine_stage.wedged  # the loop leaves the group and exits on it
        liveness = r.worker.health.liveness()
        assert not liveness.alive and "engine_timeout_s=0.2" in liveness.reason

        # a wedged engine is given nothing more
        r.broker.submit(0, "later", "later")
        r.step_until(lambda: len(r.worker.batcher) == 1, "the new record read")
        for _ in range(20):
            r.worker._step(draining=False)
        assert len(r.engine.submitted) == len(ids)
        assert "later" not in r.answers()


def test_a_broken_engine_fails_its_requests_with_5000() -> None:
    with rig(loop_config(), GatedInFlightEngine(broken=True)) as r:
        ids = submit(r, partitions=1)
        r.consumer.rebalance("assign", [P0])
        r.step_until(lambda: set(r.answers()) == ids, "the requests answered")
        assert {res.error.code for res in r.results() if res.error} == {ErrorCode.ENGINE_FAILED}
        assert len(r.results()) == len(ids)
        reason = r.worker.health.readiness().checks["model"].reason
        assert "EngineBroken" in reason and "scheduler died" in reason


def test_flex_requests_wait_in_the_queue_while_the_engine_takes_no_flex() -> None:
    """Capacity.flex false (the remote engine's server under pressure): the default
    tier's requests start, the flex ones wait in the worker's queue — not on the engine,
    where engine_timeout_s would count them — and start once flex opens; each answered
    once."""
    flex_tag = repr(FLEX_TAG).encode()
    with rig(loop_config(prefetch_count=16), GatedInFlightEngine(gated=False)) as r:
        r.engine.flex_open = False
        for n in range(3):
            tagged(r, f"flex{n}", flex_tag)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.worker.batcher) == 3, "the flex requests queued")
        for _ in range(20):  # well past batching.timeout_ms: still not started
            r.worker._step(draining=False)
        assert r.engine.submitted == [] and r.worker.engine_stage.holding_back
        assert r.worker.admission.lent == 3  # their slots lent to the other tiers
        tagged(r, "default0", b"7")
        r.step_until(lambda: r.answers() == Counter(["default0"]), "the default request")
        assert len(r.engine.submitted) == 1 and len(r.worker.batcher) == 3
        r.engine.flex_open = True
        every = {"default0", "flex0", "flex1", "flex2"}
        r.step_until(lambda: r.settled(every), "every record answered and committed")
        assert r.answers() == Counter(every) and not r.worker.engine_stage.holding_back
        assert r.worker.admission.lent == 0


def tagged(r: Rig[Any], custom_id: str, tag: bytes) -> None:
    value, headers = encode_request(InferenceRequest(custom_id=custom_id, prompt=custom_id))
    r.broker.append(0, value, [*headers, (TAG_HEADER, tag)])
