"""Outbox: what goes to the producer for an answer."""

from __future__ import annotations

from typing import cast

from worker.config import KafkaConfig
from worker.kafka.produce import Headers
from worker.kafka.publisher import OnAnswered, Publisher
from worker.loop.jobs import Identity, Source
from worker.loop.ledger import Ledger
from worker.loop.outbox import Outbox
from worker.obs.metrics import WorkerMetrics
from worker.wire.codec import decode_result
from worker.wire.messages import InferenceResult


class Producer:
    """Records what a real producer would be handed, encoding str keys as librdkafka does."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes]] = []

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: tuple[str, int],
        on_answered: OnAnswered,
        offset: int | None = None,
        on_taken: OnAnswered | None = None,
    ) -> None:
        self.sent.append((key.encode("utf-8") if isinstance(key, str) else key, value))


def test_a_result_whose_custom_id_utf8_cannot_encode_goes_out_escaped_key_and_value() -> None:
    producer = Producer()
    outbox = Outbox(
        KafkaConfig(),
        cast(Publisher, producer),
        Ledger(4),
        WorkerMetrics(model="m", engine="echo", version="0", prefetch_limit=4),
        Identity(worker_id="w", model="m"),
    )
    outbox.result(InferenceResult(custom_id="a\ud800"), Source("requests", 0, 7))
    [(key, value)] = producer.sent
    assert key == b"a\\ud800"
    assert decode_result(value, None).custom_id == "a\\ud800"


def test_encode_and_produce_time_reach_the_stage_counters_when_the_step_adds_them() -> None:
    """The outbox sums its stages and hands them over once per step (issue 42)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = WorkerMetrics(
        model="m", engine="echo", version="0", prefetch_limit=4, registry=registry
    )
    producer = Producer()
    outbox = Outbox(
        KafkaConfig(), cast(Publisher, producer), Ledger(4), metrics, Identity("w", "m")
    )

    def seconds(stage: str) -> float:
        metrics.flush()
        return registry.get_sample_value("batchpipe_stage_seconds_total", {"stage": stage}) or 0.0

    for i in range(3):
        outbox.result(InferenceResult(custom_id=f"c{i}"), Source("requests", 0, i))
    assert len(producer.sent) == 3
    assert seconds("encode") == seconds("produce") == 0  # not handed over yet
    outbox.add_stages()
    encode, produce = seconds("encode"), seconds("produce")
    assert encode > 0 and produce > 0
    outbox.add_stages()  # nothing new: nothing added
    assert (seconds("encode"), seconds("produce")) == (encode, produce)
