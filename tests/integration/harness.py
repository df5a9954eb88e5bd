"""Helpers for integration tests: publish requests, run a worker in a thread, read answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from confluent_kafka import Consumer, Message

from worker import clients
from worker.codec import decode_result, encode_request
from worker.config import Config
from worker.engines.base import Engine
from worker.messages import InferenceRequest, InferenceResult
from worker.service import Worker


def publish_raw(
    config: Config, records: Iterable[tuple[bytes | None, list[tuple[str, bytes]] | None]]
) -> int:
    """Publish raw (value, headers) records to the requests topic; returns the count."""
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    producer = clients.producer(k)
    count = 0
    for value, headers in records:
        producer.produce(k.requests_topic, value=value, headers=headers)
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0
    return count


def publish(config: Config, requests: Iterable[InferenceRequest]) -> int:
    return publish_raw(config, (encode_request(r) for r in requests))


def read_topic(config: Config, topic: str, count: int, timeout_s: float = 60) -> list[Message]:
    """``count`` records from ``topic`` (from the beginning), or fail after ``timeout_s``."""
    consumer: Consumer = clients.consumer(config.kafka, group_id=f"{topic}-reader-{time.time()}")
    consumer.subscribe([topic])
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < count and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=0.2):
                if m.error() is None:
                    records.append(m)
    finally:
        consumer.close()
    assert len(records) >= count, f"only {len(records)} of {count} records on {topic}"
    return records


def read_results(config: Config, count: int, timeout_s: float = 60) -> list[InferenceResult]:
    records = read_topic(config, config.kafka.results_topic, count, timeout_s)
    return [decode_result(m.value(), m.headers()) for m in records]


@contextmanager
def running_worker(config: Config, engine: Engine | None = None) -> Iterator[Worker]:
    """A worker running in a background thread, drained and stopped on exit."""
    worker = Worker(replace(config, metrics=replace(config.metrics, port=0)), engine)
    outcome: list[int] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.run()), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop"
        assert outcome == [0], f"worker exited with {outcome}"
