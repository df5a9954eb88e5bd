"""Helpers for integration tests: publish requests, run a worker in a thread, read answers."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from tests import ROOT
from worker.config import Config
from worker.engines.base import Engine
from worker.kafka import clients
from worker.kafka.consumer import FROM_START
from worker.loop.service import Worker
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


Headers = Sequence[tuple[str, bytes]] | None
Record = tuple[bytes | None, Headers]
KeyedRecord = tuple[bytes | None, bytes | None, Headers]


@dataclass(frozen=True)
class Published:
    """What a publish wrote: the record count and each partition's end offset after it."""

    count: int
    ends: Mapping[int, int]


def publish_keyed(
    config: Config, records: Iterable[KeyedRecord], *, max_message_bytes: int | None = None
) -> Published:
    """Publish raw (key, value, headers) records to the requests topic.

    A key spreads records over the partitions by its hash, as a keyed producer does.
    ``max_message_bytes`` raises the producer's own limit for oversized test records.
    """
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    extra = {} if max_message_bytes is None else {"message.max.bytes": max_message_bytes}
    producer = clients.producer(k, extra=extra)
    ends: dict[int, int] = {}

    def delivered(error: KafkaError | None, msg: Message) -> None:
        assert error is None, error
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        ends[partition] = max(ends.get(partition, 0), offset + 1)

    count = 0
    for key, value, headers in records:
        pairs: list[tuple[str, bytes | str | None]] | None = None if headers is None else [*headers]
        producer.produce(
            k.requests_topic, value=value, key=key, headers=pairs, on_delivery=delivered
        )
        producer.poll(0)
        count += 1
    assert producer.flush(30) == 0
    assert sum(ends.values()) >= count  # every record acknowledged
    return Published(count, ends)


def publish_raw(config: Config, records: Iterable[Record]) -> Published:
    """Publish raw (value, headers) records, without keys."""
    return publish_keyed(config, ((None, value, headers) for value, headers in records))


def publish(
    config: Config, requests: Iterable[InferenceRequest], *, keyed: bool = False
) -> Published:
    """Publish encoded requests; ``keyed`` keys each by its ``custom_id``."""
    return publish_keyed(
        config,
        ((r.custom_id.encode() if keyed else None, *encode_request(r)) for r in requests),
    )


def reader(config: Config, topic: str, *, read_committed: bool = True) -> Consumer:
    """A consumer (read_committed unless told) of every partition of ``topic`` from its
    beginning.

    Assigned, not subscribed: no group join to wait for, nothing committed.
    """
    consumer = clients.consumer(
        config.kafka, group_id=f"reader-{time.time_ns()}", read_committed=read_committed
    )
    metadata = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, FROM_START) for p in metadata.partitions])
    return consumer


def drain(consumer: Consumer, timeout_s: float, count: float = math.inf) -> list[Message]:
    """The records ``consumer`` delivers until it has ``count`` or ``timeout_s`` passed;
    closes it."""
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < count and time.monotonic() < deadline:
            records += [m for m in consumer.consume(500, timeout=0.2) if m.error() is None]
    finally:
        consumer.close()
    return records


def read_whole(
    config: Config, topic: str, at_least: int, quiet_s: float = 2.0, timeout_s: float = 60
) -> list[Message]:
    """Every record of ``topic`` a read_committed reader finds: at least ``at_least``, then
    read on until nothing more came for ``quiet_s`` (a repeat beyond the first copies is
    counted too), or fail after ``timeout_s``."""
    consumer = reader(config, topic)
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = [m for m in consumer.consume(500, timeout=0.2) if m.error() is None]
            now = time.monotonic()
            if batch:
                records += batch
                quiet_since = now
            elif len(records) >= at_least and now - quiet_since >= quiet_s:
                return records
    finally:
        consumer.close()
    raise AssertionError(f"{topic}: {len(records)} records, not {at_least}, in {timeout_s} s")


def read_topic(config: Config, topic: str, count: int, timeout_s: float = 60) -> list[Message]:
    """``count`` records from ``topic`` (from the beginning), or fail after ``timeout_s``."""
    records = drain(reader(config, topic), timeout_s, count)
    assert len(records) >= count, (
        f"only {len(records)} of {count} records on {topic}: {_where(records)}; "
        f"read_uncommitted: {_where(_read_uncommitted(config, topic))}"
    )
    return records


def _read_uncommitted(config: Config, topic: str, timeout_s: float = 10) -> list[Message]:
    """Every record of ``topic``, transactions open or aborted included: what a shortfall
    of read_committed readers is short of (an open transaction, or nothing produced)."""
    return drain(reader(config, topic, read_committed=False), timeout_s)


def visibility(config: Config, topic: str, timeout_s: float = 10) -> str:
    """Per partition of ``topic``, how many records a read_committed reader finds against a
    read_uncommitted one (open or aborted transactions included), for an assertion
    message: where they differ, a transaction the broker has not completed holds the rest
    back from read_committed readers (docs/architecture.md §7)."""
    committed = Counter(m.partition() or 0 for m in drain(reader(config, topic), timeout_s))
    everything = Counter(m.partition() or 0 for m in _read_uncommitted(config, topic, timeout_s))
    counts = [f"{p}: {committed[p]}/{everything[p]}" for p in sorted(committed | everything)]
    return f"{topic} read_committed/read_uncommitted by partition: {', '.join(counts)}"


def _where(records: Sequence[Message]) -> str:
    """Records as ``partition:offset=key``, for an assertion message."""
    return ", ".join(
        f"{m.partition()}:{m.offset()}={m.key()!r}"
        for m in sorted(records, key=lambda m: (m.partition() or 0, m.offset() or 0))
    )


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
    """``batchpipe worker -c config_path --set …`` as a child process.

    The test's own ``BATCHPIPE_*`` variables (``BATCHPIPE_CHAOS_REPORT``, or a developer's
    settings) are not passed on: the worker would read them as configuration.
    """
    args = [a for s in sets for a in ("--set", s)]
    command = [sys.executable, "-m", "batchpipe.cli", "worker", "-c", str(config_path), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHPIPE_")}
    return subprocess.Popen(command, cwd=ROOT, env=env)


class ResultWatcher:
    """Reads the results and dead-letter topics as they fill.

    ``raw`` counts result records, ``ids`` the distinct ``custom_id``s among them (with
    ``first`` the first result of each, ``per_id`` how many records each had); ``dead``
    counts dead letters, ``dead_keys`` them by record key (``dead_codes``: the
    ``error-code`` header of each key's first). :attr:`longest_stall_s` is measured on
    the records' own timestamps, so it does not depend on when the watcher is polled.
    """

    def __init__(self, config: Config) -> None:
        k = config.kafka
        # a reader is assigned the partitions that exist when it starts
        clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
        self._started = time.time()
        self._results = reader(config, config.kafka.results_topic)
        self._dead_letters = reader(config, config.kafka.dead_letter_topic)
        self.raw = 0
        self.ids: set[str] = set()
        self.first: dict[str, InferenceResult] = {}
        self.per_id: Counter[str] = Counter()
        self.dead = 0
        self.dead_keys: Counter[bytes | None] = Counter()
        self.dead_codes: dict[bytes | None, int] = {}
        self._answered_at: dict[str, float] = {}  # each custom_id's earliest result
        self._dead_at: list[float] = []

    def poll(self, seconds: float) -> int:
        """Read for ``seconds``; returns how many records arrived."""
        arrived = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for m in self._results.consume(num_messages=1000, timeout=0.1):
                if m.error() is None:
                    arrived += 1
                    self._result(m)
            for m in self._dead_letters.consume(num_messages=1000, timeout=0.01):
                if m.error() is None:
                    arrived += 1
                    self._dead_letter(m)
        return arrived

    def _result(self, m: Message) -> None:
        result = decode_result(m.value(), m.headers())
        self.raw += 1
        self.per_id[result.custom_id] += 1
        at = _written_at(m)
        self._answered_at[result.custom_id] = min(self._answered_at.get(result.custom_id, at), at)
        if result.custom_id not in self.ids:
            self.ids.add(result.custom_id)
            self.first[result.custom_id] = result

    def _dead_letter(self, m: Message) -> None:
        self.dead += 1
        self.dead_keys[m.key()] += 1
        code = dict(m.headers() or []).get("error-code", b"0")
        self.dead_codes.setdefault(m.key(), int(code or b"0"))
        self._dead_at.append(_written_at(m))

    @property
    def longest_stall_s(self) -> float:
        """The longest time, from the watcher's start to the last answer read, in which no
        new answer (a result for a new ``custom_id``, or a dead letter) was written."""
        times = sorted([self._started, *self._answered_at.values(), *self._dead_at])
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def wait_until(
        self,
        done: Callable[[], bool],
        timeout_s: float,
        what: str,
        check: Callable[[], None] | None = None,
    ) -> None:
        """Read until ``done()``; fail after ``timeout_s`` saying ``what`` was awaited, or
        as soon as ``check()`` (called between reads) fails."""
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            if check is not None:
                check()
            self.poll(0.2)
        assert done(), f"not within {timeout_s:g} s: {what} (results {self.raw}, dead {self.dead})"

    def wait_for(self, distinct: int, timeout_s: float) -> None:
        self.wait_until(
            lambda: len(self.ids) >= distinct, timeout_s, f"{distinct} distinct results"
        )

    def close(self) -> None:
        self._results.close()
        self._dead_letters.close()


def _written_at(m: Message) -> float:
    """When the producer wrote ``m`` (unix seconds; the broker's time when it has none)."""
    _, ms = m.timestamp()
    return ms / 1000.0 if ms > 0 else time.time()


def committed_lag(config: Config, ends: Mapping[int, int]) -> int:
    """Records of the requests topic before ``ends`` that the workers' group has not
    committed past: the true lag, whatever a broker's watermarks say."""
    topic = config.kafka.requests_topic
    # the workers' group id, never subscribed: it reads the group's offsets, never joins
    consumer = clients.consumer(config.kafka)
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=30)
    finally:
        consumer.close()
    return sum(ends[tp.partition] - max(tp.offset, 0) for tp in committed)


def wait_for_lag_zero(config: Config, ends: Mapping[int, int], timeout_s: float) -> None:
    """Wait until the group's committed offsets reach ``ends``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    lag = committed_lag(config, ends)
    while lag > 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a condition with a bound, not waiting for a moment
        lag = committed_lag(config, ends)
    assert lag == 0, f"lag still {lag} after {timeout_s:g} s"
