"""Helpers for integration tests: publish requests, run a worker in a thread, read answers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from tests import ROOT
from worker.config import Config
from worker.engines.base import Engine
from worker.kafka import clients
from worker.service import Worker
from worker.wire.codec import decode_result, encode_request
from worker.wire.messages import InferenceRequest, InferenceResult


def isolated_config(bootstrap: str, prefix: str = "test") -> Config:
    """Defaults, pointed at ``bootstrap``, with topics and a group id no one else uses."""
    suffix = uuid.uuid4().hex[:12]
    config = Config()
    kafka = replace(
        config.kafka,
        bootstrap_servers=bootstrap,
        group_id=f"{prefix}-group-{suffix}",
        requests_topic=f"{prefix}-requests-{suffix}",
        results_topic=f"{prefix}-results-{suffix}",
        dead_letter_topic=f"{prefix}-dead-letter-{suffix}",
        partitions=3,
    )
    return replace(config, kafka=kafka)


Record = tuple[bytes | None, Sequence[tuple[str, bytes]] | None]


def publish_raw(config: Config, records: Iterable[Record]) -> int:
    """Publish raw (value, headers) records to the requests topic; returns the count."""
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    producer = clients.producer(k)
    count = 0
    for value, headers in records:
        pairs: list[tuple[str, bytes | str | None]] | None = None if headers is None else [*headers]
        producer.produce(k.requests_topic, value=value, headers=pairs)
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0
    return count


def publish(config: Config, requests: Iterable[InferenceRequest]) -> int:
    return publish_raw(config, (encode_request(r) for r in requests))


def reader(config: Config, topic: str) -> Consumer:
    """A read_committed consumer of every partition of ``topic`` from its beginning.

    Assigned, not subscribed: no group join to wait for, nothing committed.
    """
    consumer = clients.consumer(config.kafka, group_id=f"reader-{time.time_ns()}")
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
    return consumer


def read_topic(config: Config, topic: str, count: int, timeout_s: float = 60) -> list[Message]:
    """``count`` records from ``topic`` (from the beginning), or fail after ``timeout_s``."""
    consumer = reader(config, topic)
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


def count_records(config: Config, topic: str, settle_s: float) -> int:
    """All records on ``topic``: reads until nothing new arrived for ``settle_s``."""
    consumer = reader(config, topic)
    count, quiet_since = 0, time.monotonic()
    try:
        while time.monotonic() - quiet_since < settle_s:
            batch = [m for m in consumer.consume(num_messages=1000, timeout=0.2) if not m.error()]
            if batch:
                count += len(batch)
                quiet_since = time.monotonic()
    finally:
        consumer.close()
    return count


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


def write_config(config: Config, path: Path) -> Path:
    """The config as a YAML file a ``batchpipe worker -c`` process reads."""
    path.write_text(yaml.safe_dump(config.to_dict()))
    return path


def start_worker_process(config_path: Path, *sets: str) -> subprocess.Popen[bytes]:
    args = [a for s in sets for a in ("--set", s)]
    command = [sys.executable, "-m", "batchpipe.cli", "worker", "-c", str(config_path), *args]
    return subprocess.Popen(command, cwd=ROOT)


class ResultWatcher:
    """Reads the results topic as it fills: raw records and distinct ``custom_id``s."""

    def __init__(self, config: Config) -> None:
        self._consumer = reader(config, config.kafka.results_topic)
        self.raw = 0
        self.ids: set[str] = set()

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in self._consumer.consume(num_messages=1000, timeout=0.1):
                if m.error() is None:
                    self.raw += 1
                    self.ids.add(decode_result(m.value(), m.headers()).custom_id)

    def wait_for(self, distinct: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.ids) < distinct and time.monotonic() < deadline:
            self.poll(0.2)
        assert len(self.ids) >= distinct, f"{len(self.ids)} of {distinct} answered"

    def close(self) -> None:
        self._consumer.close()
