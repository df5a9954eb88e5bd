"""Flow control of the worker loop against in-memory Kafka: backpressure and draining,
with a static engine and with an in-flight one."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from worker.loop.service import EXIT_OK, Worker

from .fakes import FakeBroker, FakeClients, GatedEngine, GatedInFlightEngine
from .rig import P0, P1, RESULTS, TOPIC, WAIT_S, Rig, loop_config, rig


def fill(r: Rig[Any], per_partition: int) -> set[str]:
    ids = set()
    for p in (0, 1):
        for i in range(per_partition):
            r.broker.submit(p, f"p{p}-{i}", f"hello {p} {i}")
            ids.add(f"p{p}-{i}")
    return ids


def wait_for(done: Callable[[], bool], what: str) -> None:
    """Wait (bounded by ``WAIT_S``) for a condition another thread makes true."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.001)


def paused_gauge(r: Rig[Any]) -> float | None:
    return r.worker.metrics.registry.get_sample_value("batchpipe_paused_partitions")


def on_engine(engine: GatedEngine | GatedInFlightEngine) -> int:
    """Requests held by the engine now: the batch on it, or those in flight."""
    if isinstance(engine, GatedInFlightEngine):
        return len(engine.running)
    return len(engine.batches[-1]) if engine.batches else 0


ENGINES = [
    pytest.param(GatedEngine, id="static"),
    pytest.param(GatedInFlightEngine, id="in-flight"),
]
MakeEngine = Callable[[], GatedEngine | GatedInFlightEngine]


@pytest.mark.parametrize("make_engine", ENGINES)
def test_a_full_worker_pauses_its_partitions_and_resumes_them_when_room_frees(
    make_engine: MakeEngine,
) -> None:
    with rig(loop_config(prefetch_count=4, max_batch_size=2), make_engine()) as r:
        ids = fill(r, per_partition=6)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.paused() == {P0, P1}, "the partitions paused")
        assert len(r.worker.ledger) == 4
        assert on_engine(r.engine) == 2  # max_batch_size: the batch, or what is in flight
        assert paused_gauge(r) == 2

        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.consumer.paused() == set()
        assert paused_gauge(r) == 0
        assert r.worker.admission.peak == 4  # never more than prefetch_count in flight
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_partitions_paused_revoked_and_assigned_again_are_read_again() -> None:
    with rig(loop_config(prefetch_count=4, max_batch_size=2), GatedEngine()) as r:
        ids = fill(r, per_partition=6)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.paused() == {P0, P1}, "the partitions paused")
        r.consumer.rebalance("revoke", [P0, P1])
        r.step_until(lambda: not r.consumer.rebalancing, "the revoke")
        r.engine.open()
        r.step_until(lambda: not r.worker.engine_stage.busy, "the old batch to finish")

        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert paused_gauge(r) == 0


def test_records_polled_while_full_are_held_and_each_answered_once() -> None:
    with rig(loop_config(prefetch_count=4, max_batch_size=2), GatedEngine()) as r:
        r.consumer.returns_while_paused = True
        ids = fill(r, per_partition=6)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.paused() == {P0, P1}, "the partitions paused")
        # polling a paused consumer (to serve rebalances) returns records all the same
        r.step_until(lambda: r.consumer.delivered == len(ids), "every record read")
        assert len(r.worker.ledger) == 4

        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert r.worker.admission.peak == 4


def test_a_draining_worker_serves_rebalances_while_its_batch_finishes() -> None:
    with rig(loop_config(max_batch_size=2), GatedEngine()) as r:
        fill(r, per_partition=1)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(r.engine.entered.is_set, "a batch on the engine")
        calls = r.consumer.calls
        drain = threading.Thread(target=r.worker._drain, daemon=True)
        drain.start()
        try:
            wait_for(lambda: r.consumer.calls > calls, "the drain to poll")
            r.consumer.rebalance("revoke", [P1])  # another member joins: P1 moves
            wait_for(lambda: not r.consumer.rebalancing, "the revoke served while draining")
        finally:
            r.engine.open()
            drain.join(WAIT_S)
        assert not drain.is_alive(), "the drain did not end"
        # P1's record is its new owner's to answer; P0's is answered and committed
        assert r.answers() == Counter({"p0-0": 1})
        assert r.broker.committed == {P0: 1}


@pytest.mark.parametrize("make_engine", ENGINES)
def test_sigterm_drains_in_flight_work_commits_it_and_exits_0(make_engine: MakeEngine) -> None:
    # no commit before the end: what is committed, the drain committed
    config = loop_config(max_batch_size=2, commit_interval_ms=3_600_000)
    broker = FakeBroker(TOPIC, 1)
    clients = FakeClients(config.kafka, broker)
    engine = make_engine()
    worker = Worker(config, engine, clients)
    ids = {f"r{i}" for i in range(3)}
    for custom_id in sorted(ids):
        broker.submit(0, custom_id, f"hello {custom_id}")
    clients.fake_consumer.rebalance("assign", [P0])

    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(worker.run()), daemon=True)
    thread.start()
    try:
        assert engine.entered.wait(WAIT_S), "nothing reached the engine"
        worker.stop()  # what the SIGTERM handler does
    finally:
        engine.open()
        thread.join(WAIT_S)
    assert not thread.is_alive(), "the worker did not stop"
    assert exit_codes == [EXIT_OK]
    assert broker.answers(RESULTS) == Counter(dict.fromkeys(ids, 1))
    assert broker.committed == {P0: 3}
    assert clients.fake_consumer.closed
    assert {RESULTS, config.kafka.dead_letter_topic} <= broker.topics  # ensured at start
    if isinstance(engine, GatedInFlightEngine):
        assert engine.aborted == []  # drained, not dropped
