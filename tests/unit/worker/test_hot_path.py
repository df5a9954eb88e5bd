"""The loop's per-poll work (issue 25): what is done once per poll or per batch instead of
once per record still counts every record."""

from __future__ import annotations

import time
from collections import Counter
from functools import partial

from batcher import OffsetTracker
from worker.config import KafkaConfig
from worker.errors import ErrorCode
from worker.kafka.publisher import AtLeastOncePublisher

from .fake_producer import FakeProducers
from .fakes import FakeBroker, FakeConsumer, GatedEngine, GatedInFlightEngine
from .rig import P0, P1, TOPIC, loop_config, rig


def stage_seconds(registry: object, stage: str) -> float:
    value = registry.get_sample_value(  # type: ignore[attr-defined]
        "batchpipe_stage_seconds_total", {"stage": stage}
    )
    return float(value or 0.0)


def test_a_poll_of_records_is_decoded_in_one_pass_and_its_time_counted() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        for i in range(6):
            r.broker.submit(i % 2, f"r{i}", f"hello {i}")
        r.broker.append(0, b"\x00not a request")  # a dead letter among them
        r.consumer.rebalance("assign", [P0, P1])
        ids = {f"r{i}" for i in range(6)}
        r.step_until(lambda: r.settled(ids), "every record answered and committed")

        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        registry = r.worker.metrics.registry
        assert stage_seconds(registry, "decode") > 0.0
        errors = registry.get_sample_value(
            "batchpipe_request_errors_total", {"code": str(int(ErrorCode.MALFORMED))}
        )
        assert errors == 1
        completed = registry.get_sample_value(
            "batchpipe_requests_total", {"model": r.worker.identity.model, "status": "completed"}
        )
        assert completed == 6
        # the engine times of a drain are observed together, each of them counted
        engine = registry.get_sample_value("batchpipe_engine_request_seconds_count")
        assert engine == 6
        waits = registry.get_sample_value("batchpipe_batch_wait_seconds_count")
        assert waits == 6


def test_at_least_once_commits_on_the_interval_what_is_delivered_without_waiting() -> None:
    broker = FakeBroker(TOPIC, 1)
    tracker = OffsetTracker()
    publisher = AtLeastOncePublisher(
        KafkaConfig(), FakeConsumer(broker), tracker, FakeProducers(broker)
    )
    origin = (TOPIC, 0)
    for offset in range(3):
        tracker.add(origin, offset)
        publisher.send("results", "k", b"v", [], origin, partial(tracker.done, origin, offset))
    broker.deliveries_held = True  # the broker has not answered yet
    publisher.maybe_commit(time.monotonic() + 60)
    assert broker.committed == {}  # nothing delivered: nothing committed, and no waiting
    broker.deliveries_held = False
    publisher.maybe_commit(time.monotonic() + 120)
    assert broker.committed == {origin: 3}

    broker.deliveries_held = True
    tracker.add(origin, 3)
    publisher.send("results", "k", b"v", [], origin, partial(tracker.done, origin, 3))
    publisher.revoke([origin])  # a hand-over waits for every delivery
    assert broker.committed == {origin: 4}


def test_an_in_flight_engine_s_completions_are_each_observed() -> None:
    with rig(loop_config(), GatedInFlightEngine(gated=False)) as r:
        for i in range(5):
            r.broker.submit(i % 2, f"r{i}", f"hello {i}")
        r.consumer.rebalance("assign", [P0, P1])
        ids = {f"r{i}" for i in range(5)}
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        registry = r.worker.metrics.registry
        assert registry.get_sample_value("batchpipe_engine_request_seconds_count") == 5
        assert registry.get_sample_value("batchpipe_batch_wait_seconds_count") == 5
