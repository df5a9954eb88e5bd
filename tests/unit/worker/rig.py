"""A worker wired to the in-memory fakes, and a bounded way to step its loop."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic

from typing_extensions import TypeVar  # a default (PEP 696): a bare ``Rig`` is a static one

from batcher import Partition
from worker.config import (
    BatchingConfig,
    Config,
    EngineConfig,
    KafkaConfig,
    MetricsConfig,
    SchedulingConfig,
    WorkerConfig,
)
from worker.loop.service import Worker
from worker.wire.messages import InferenceResult

from .fakes import (
    Delivery,
    FakeBroker,
    FakeClients,
    FakeConsumer,
    GatedEngine,
    GatedInFlightEngine,
)

TOPIC = "requests"
RESULTS = "results"
P0: Partition = (TOPIC, 0)
P1: Partition = (TOPIC, 1)
E = TypeVar("E", bound=GatedEngine | GatedInFlightEngine, default=GatedEngine)
#: how long a test waits for a condition before it fails (a bound, not an expectation)
WAIT_S = 5.0


def loop_config(
    *,
    prefetch_count: int = 16,
    max_batch_size: int = 4,
    engine_timeout_s: float = 60.0,
    commit_interval_ms: int = 0,
) -> Config:
    """Small batches formed at once; commits on every step unless told otherwise."""
    return Config(
        kafka=KafkaConfig(
            requests_topic=TOPIC,
            results_topic=RESULTS,
            dead_letter_topic="dead-letter",
            commit_interval_ms=commit_interval_ms,
        ),
        batching=BatchingConfig(
            prefetch_count=prefetch_count,
            max_batch_size=max_batch_size,
            timeout_ms=5,
            adaptive=False,
            dedup=False,
        ),
        engine=EngineConfig(kind="echo", engine_timeout_s=engine_timeout_s),
        metrics=MetricsConfig(enabled=False),
        worker=WorkerConfig(worker_id="w-test", drain_timeout_s=WAIT_S),
        # the loop alone: the feeder (a Kafka client of its own) has tests/unit/worker/feeder
        scheduling=SchedulingConfig(fair=False),
    )


@dataclass
class Rig(Generic[E]):
    worker: Worker
    broker: FakeBroker
    consumer: FakeConsumer
    engine: E

    def start(self) -> None:
        """What :meth:`Worker.run` does before its loop."""
        self.worker.engine.load()
        self.worker.health.set_model_loaded(True)
        self.worker._start_kafka()

    def step_until(self, done: Callable[[], bool], what: str) -> None:
        """Run loop iterations until ``done()``; fail after :data:`WAIT_S`."""
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            self.worker._step(draining=False)

    def results(self) -> list[InferenceResult]:
        return self.broker.results(RESULTS)

    def answers(self) -> Counter[str]:
        return self.broker.answers(RESULTS)

    def settled(self, ids: set[str]) -> bool:
        """Every one of ``ids`` answered, nothing held, every answer committed."""
        logs = self.broker.logs
        return (
            set(self.answers()) >= ids
            and len(self.worker.ledger) == 0
            and all(self.broker.committed.get(p, 0) == len(log) for p, log in logs.items())
        )


@contextmanager
def rig(
    config: Config, engine: E, partitions: int = 2, delivery: Delivery = "fake"
) -> Iterator[Rig[E]]:
    """A started worker on a fresh broker; on exit the engine is opened and the worker shut.

    ``delivery`` chooses the publisher: the fake one, or a real one on fake producers.
    """
    broker = FakeBroker(TOPIC, partitions)
    clients = FakeClients(config.kafka, broker, delivery)
    worker = Worker(config, engine, clients)
    r = Rig(worker, broker, clients.fake_consumer, engine)
    r.start()
    try:
        yield r
    finally:
        engine.open()
        worker._shutdown()
