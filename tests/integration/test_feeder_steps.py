"""A feeder step puts its slices on the broker before the state record that says they were
fed (worker/feeder/mover.py).

The embedded broker shows read_committed readers the records of aborted transactions too.
A feeder killed mid-step with its ``fed_to`` on the broker and part of its slice still in
librdkafka's queue made the next feeder skip requests that were never written: CI's
three-worker fair-share test lost 22 requests in one takeover that way (reproduced on a
broker slowed by 900 transactional ids). Here a feeder moves two batches alone (no
worker, so the depth floor is raised to hold them all) while every producer call on the
state topic notes how many records librdkafka still held undelivered at that moment.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition
from prometheus_client import CollectorRegistry

from batcher.fairshare import FairShare
from batchpipe import client as client_module
from batchpipe.batchfile import iter_file
from batchpipe.client import Client
from bench.common import DemandStandin
from bench.fairness_arms import lines
from tests.integration.harness import drain, read_topic, reader
from worker.config import Config
from worker.errors import ErrorCode
from worker.feeder.credits import Credits
from worker.feeder.feeder import Feeder
from worker.feeder.naming import ensure_pending, pending_topic, state_topic
from worker.kafka import clients
from worker.kafka.cancellations import Stop
from worker.wire.codec import CodecLimits, decode_request

pytestmark = pytest.mark.integration


class _Noting:
    """A producer that notes, at each record for ``watched``, how many records of other
    topics it still held undelivered."""

    def __init__(self, inner: Any, watched: str, held: list[int]) -> None:
        self._inner, self._watched, self._held = inner, watched, held
        self._watched_queued = 0  # records for ``watched`` since the last commit

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if topic == self._watched:
            self._held.append(len(self._inner) - self._watched_queued)
            self._watched_queued += 1
        self._inner.produce(topic, *args, **kwargs)

    def commit_transaction(self, *args: Any) -> None:
        self._inner.commit_transaction(*args)
        self._watched_queued = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_steps_state_is_produced_only_once_its_slices_are_acknowledged(
    kafka_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = replace(
        kafka_config,
        kafka=replace(kafka_config.kafka, partitions=6),
        engine=replace(kafka_config.engine, kind="echo", model="echo"),
        scheduling=replace(kafka_config.scheduling, fair=True),
    )
    held: list[int] = []
    plain = clients.producer

    def noting(*args: Any, **kwargs: Any) -> Any:
        return _Noting(plain(*args, **kwargs), state_topic(config.kafka.requests_topic), held)

    client = Client(config)
    client.submit(lines("a", 1_500), key="a")
    client.submit(lines("b", 1_500), key="b")
    standin = DemandStandin(config, 4_000).__enter__()  # no worker: credit for 4,000
    monkeypatch.setattr(clients, "producer", noting)  # the feeder's, from here on
    feeder = Feeder(config, CollectorRegistry())
    feeder.start()
    try:
        moved = read_topic(config, config.kafka.requests_topic, 3_000, timeout_s=120)
    finally:
        feeder.stop()
        standin.__exit__()
    limits = CodecLimits.from_config(config.limits)
    ids = [decode_request(m.value(), m.headers(), limits).custom_id for m in moved]
    assert sorted(ids) == sorted(f"{p}-{i}" for p in "ab" for i in range(1_500))
    assert held, "no state record was produced"
    assert set(held) == {0}, f"state produced with records undelivered: {held[:20]}"


def test_hostile_pending_records_and_a_batch_that_raises_stop_no_other_batch(
    kafka_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38: a weight of 1e-308 or a 5,000-digit tokens header crash-looped every
    feeder of the fleet. Here such records, a record without headers and a batch whose
    share raises (injected) sit on the pending topic ahead of a good batch: the good batch
    is moved whole, so are the hostile records (the workers answer each), and the raising
    batch is quarantined — a stop naming the cause on the control topic, its records
    drained for the workers to answer 4007."""
    config = replace(
        kafka_config,
        kafka=replace(kafka_config.kafka, partitions=3),
        scheduling=replace(kafka_config.scheduling, fair=True),
    )
    k = config.kafka
    ensure_pending(k, config.limits, [k.requests_topic])
    hostile: list[tuple[bytes, list[tuple[str, str | bytes | None]]]] = [
        (b"tiny-0", [("batchpipe-batch-id", b"tiny"), ("batchpipe-weight", b"1e-308")]),
        (b"tiny-1", [("batchpipe-batch-id", b"tiny"), ("batchpipe-weight", b"5e-324")]),
        (b"long-0", [("batchpipe-batch-id", b"long"), ("batchpipe-tokens", b"9" * 5_000)]),
        (b"huge-0", [("batchpipe-batch-id", b"huge"), ("batchpipe-tokens", b"1" + b"0" * 400)]),
        (b"bare-0", []),
    ]
    hostile += [(f"evil-{i}".encode(), [("batchpipe-batch-id", b"evil")]) for i in range(5)]
    producer = clients.producer(k)
    for key, headers in hostile:
        producer.produce(
            pending_topic(k.requests_topic), key=key, value=b"\x00junk", headers=headers
        )
    assert producer.flush(30) == 0
    Client(config).submit(lines("good", 200), key="good")

    plain = FairShare.add

    def add(self: FairShare, batch_id: str, *args: Any, **kwargs: Any) -> None:
        if batch_id == "evil":
            raise RuntimeError("injected fault")
        plain(self, batch_id, *args, **kwargs)

    monkeypatch.setattr(FairShare, "add", add)
    with _feeding(config):
        moved = read_topic(config, k.requests_topic, 200 + len(hostile), timeout_s=120)
    keys = sorted((m.key() or b"").decode() for m in moved)
    assert keys == sorted([*(f"good-{i}" for i in range(200)), *(k.decode() for k, _ in hostile)])
    stops = [Stop.decode(m.value() or b"") for m in read_topic(config, k.control_topic, 1)]
    (evil,) = [s for s in stops if s.batch_id == "evil"]
    assert evil.code == ErrorCode.BATCH_QUARANTINED
    assert "RuntimeError: injected fault" in evil.message


@contextmanager
def _feeding(
    config: Config, free: int = 4_000, registry: CollectorRegistry | None = None
) -> Iterator[DemandStandin]:
    """A feeder alone: no worker reports demand, a stand-in gives it credit for about
    ``free`` records, never read (§10)."""
    with DemandStandin(config, free) as standin:
        feeder = Feeder(config, registry or CollectorRegistry())
        feeder.start()
        try:
            yield standin
        finally:
            feeder.stop()


def _fed_alone(config: Config, registry: CollectorRegistry, count: int) -> None:
    """``count`` requests submitted and moved by a feeder alone (no worker)."""
    Client(config).submit(lines("t", count), key="t")
    with _feeding(config, registry=registry):
        read_topic(config, config.kafka.requests_topic, count, timeout_s=120)
        deadline = time.monotonic() + 60  # the trim's outcome is read at the next step
        while registry.get_sample_value("batchpipe_feeder_trim_supported") is None:
            assert time.monotonic() < deadline, "no trim outcome reported within 60 s"
            time.sleep(0.2)


@pytest.mark.skipif(
    bool(os.environ.get("KAFKA_BOOTSTRAP")), reason="the embedded broker's behaviour"
)
def test_on_the_embedded_broker_trimming_is_reported_unsupported(kafka_config: Config) -> None:
    """Tansu 0.6 closes the connection on DeleteRecords: the feeder says so (metric 0,
    a warning) and goes on feeding; the pending topic then keeps every record."""
    config = replace(kafka_config, scheduling=replace(kafka_config.scheduling, fair=True))
    registry = CollectorRegistry()
    _fed_alone(config, registry, 50)
    assert registry.get_sample_value("batchpipe_feeder_trim_supported") == 0


@pytest.mark.skipif(
    not os.environ.get("KAFKA_BOOTSTRAP"), reason="needs a broker with DeleteRecords"
)
def test_the_pending_topics_low_watermark_advances_as_batches_are_fed(
    kafka_config: Config,
) -> None:
    config = replace(kafka_config, scheduling=replace(kafka_config.scheduling, fair=True))
    registry = CollectorRegistry()
    _fed_alone(config, registry, 50)
    assert registry.get_sample_value("batchpipe_feeder_trim_supported") == 1
    consumer = clients.consumer(config.kafka)
    try:
        partition = TopicPartition(pending_topic(config.kafka.requests_topic), 0)
        low, _ = consumer.get_watermark_offsets(partition, timeout=30)
    finally:
        consumer.close()
    assert low >= 50


def test_after_five_takeovers_the_state_topic_holds_no_finished_batch(
    kafka_config: Config,
) -> None:
    """Issue 38: a batch fed whole while an older batch pinned the committed offset was
    skipped, never finished, by the next feeder's scan, so its state entry outlived every
    takeover. Five feeders in turn (no worker: each feeds its credit, 100 records, then
    stops): each feeds a new 5-line batch whole and part of an old 1,000-line one; a sixth
    with room for all feeds the rest. The state topic, folded, then holds no batch."""
    k = kafka_config.kafka
    config = replace(
        kafka_config,
        scheduling=replace(kafka_config.scheduling, fair=True),
    )
    client = Client(config)
    client.submit(lines("old", 1_000), batch_id="old", key="old")
    moved = 0
    for takeover in range(5):
        client.submit(lines(f"s{takeover}", 5), batch_id=f"s{takeover}", key=f"s{takeover}")
        b = config.batching  # 100 in all, with the credit's cushion (nothing is read)
        cushion = Credits(b.prefetch_count, engine=b.max_batch_size).cushion(0.0)
        with _feeding(config, free=100 - cushion):
            moved += 100
            read_topic(config, k.requests_topic, moved, timeout_s=120)
    with _feeding(config, free=4_000):
        read_topic(config, k.requests_topic, 1_025, timeout_s=120)
        deadline, live = time.monotonic() + 60, [b"?"]
        while live:
            assert time.monotonic() < deadline, f"state entries left: {live}"
            folded: dict[bytes, bytes | None] = {}
            for m in _read_all(config, state_topic(k.requests_topic)):
                folded[m.key() or b""] = m.value()
            live = [
                key for key, value in folded.items() if value is not None and key[:1] != b"\x00"
            ]
            time.sleep(0.5)


def _read_all(config: Config, topic: str) -> list[Message]:
    return drain(reader(config, topic), timeout_s=5)


def test_a_long_upload_in_progress_hides_no_batch_committed_meanwhile(
    kafka_config: Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 38: the feeder reads read_committed, so one open publish transaction hid
    every batch committed after it until it ended. A batch is now published without a
    transaction (issue 49) and held by the feeder until its end marker. Here alice's
    upload stops reading its file after 1,500 of its 3,000 lines until bob's 10-line
    batch, published meanwhile, has been fed whole (before issue 38: never, until hers
    committed); none of hers is fed before her marker."""
    config = replace(kafka_config, scheduling=replace(kafka_config.scheduling, fair=True))
    k = config.kafka
    paused, bob_fed = threading.Event(), threading.Event()
    read_file = iter_file

    def stalling(path: Any, limits: Any) -> Iterator[Any]:
        for n, request in enumerate(read_file(path, limits)):
            if n == 1_500:  # a slow store: the upload waits for its next line
                paused.set()
                bob_fed.wait(120)
            yield request

    monkeypatch.setattr(client_module, "iter_file", stalling)
    big = tmp_path / "alice.jsonl"
    big.write_text("".join(json.dumps(line) + "\n" for line in lines("alice", 3_000)))
    Client(config).submit(lines("warm", 1), key="warm")
    standin = DemandStandin(config, 4_000).__enter__()  # no worker: credit for 4,000
    feeder = Feeder(config, CollectorRegistry())
    feeder.start()
    alice = threading.Thread(
        target=lambda: Client(config).publish_file(big, 3_000, None, {"echo"}, key="alice")
    )
    try:
        read_topic(config, k.requests_topic, 1, timeout_s=120)  # the feeder feeds
        alice.start()
        assert paused.wait(120), "alice's upload did not reach its pause"
        Client(config).submit(lines("bob", 10), key="bob")
        moved = read_topic(config, k.requests_topic, 11, timeout_s=60)
        bob_fed.set()
        keys = {(m.key() or b"").decode() for m in moved}
        assert {f"bob-{i}" for i in range(10)} <= keys
        assert not any(key.startswith("alice-") for key in keys)
        alice.join(120)
        everything = read_topic(config, k.requests_topic, 3_011, timeout_s=120)
        assert len({m.key() for m in everything}) == 3_011
    finally:
        bob_fed.set()
        alice.join(120)
        feeder.stop()
        standin.__exit__()
