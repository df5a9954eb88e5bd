"""Every transaction the worker commits becomes visible to read_committed readers.

The embedded broker (Tansu 0.6, ``dynostore.rs`` ``txn_end``) only completes an ended
transaction once every other transaction on the same partitions that began before it
ended is ended too; until then it stays PrepareCommit and holds back the partitions'
last stable offset. A transaction left there is completed by the end of a later one that
shares a partition with it, or by its own producer's next transaction, so a chain of
overlapping transactions whose first link's producer then falls idle kept results
invisible for good (issue 24: 7 of 9 results read, 9 read_uncommitted). One worker's
transactions follow each other since issue 32, but other workers' still overlap them.

The chain here: the worker's transaction writes results partition 0 while another
worker's, open, writes 0 and 1; a third's writes 1. The worker's ends while the second is
open, the second while the third is open; the third completes itself and the second (they
share partition 1) but not the worker's, until the worker, idle, ends one more.

Three workers' transactions open at once and ended in each of the six orders: each worker
settles (offsets-only transactions with back-off while idle), so every result becomes
visible within the stated bound whatever the order.
"""

from __future__ import annotations

import itertools
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, cast
from uuid import uuid4

import pytest

from batcher import OffsetTracker, Partition
from tests.integration.harness import read_topic, reader
from worker.config import Config
from worker.kafka import clients
from worker.kafka.produce import KafkaProducer, RecordLimit
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import SETTLE_MAX_GAP_S, TransactionalPublisher

pytestmark = pytest.mark.integration

RESULT_PARTITIONS = 2


def _key(partition: int, name: str) -> bytes:
    """A key librdkafka's default partitioner (CRC-32 of the key) puts on ``partition``."""
    for n in range(1000):
        key = f"{name}-{n}".encode()
        if zlib.crc32(key) % RESULT_PARTITIONS == partition:
            return key
    raise AssertionError("unreachable: half of all keys land on each partition")


def test_a_chain_of_overlapping_transactions_all_become_visible(kafka_config: Config) -> None:
    k = replace(kafka_config.kafka, partitions=1)
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    tracker = OffsetTracker()
    publisher = TransactionalPublisher(
        k,
        clients.consumer(k),
        tracker,
        clients.Producers(k, 1_000_000),
        f"chain-{uuid4()}",
        BrokerStableCheck(k),
    )
    origin: Partition = (k.requests_topic, 0)
    publisher.assign([origin])
    others = [clients.producer(k, transactional_id=f"other-{uuid4()}") for _ in range(2)]
    for other in others:
        other.init_transactions(15)
        other.begin_transaction()
    second, third = others
    first, seconds = _key(0, "first"), [_key(0, "second"), _key(1, "second")]
    for key in seconds:
        second.produce(k.results_topic, b"answer", key)
    second.flush(15)  # at the broker, in an open transaction
    tracker.add(origin, 0)
    publisher.send(k.results_topic, first, b"answer", [], origin, partial(tracker.done, origin, 0))
    try:
        publisher.commit()  # ends while the second is open
        last = _key(1, "third")
        third.produce(k.results_topic, b"answer", last)
        third.flush(15)
        second.commit_transaction(15)  # ends while the third is open
        third.commit_transaction(15)
        publisher.commit()  # the next commit interval: the worker is idle now
        records = read_topic(kafka_config, k.results_topic, 4, timeout_s=15)
        assert sorted(m.key() or b"" for m in records) == sorted([first, *seconds, last])
    finally:
        publisher.close()


def test_the_stable_check_names_the_partitions_an_unfinished_transaction_holds(
    kafka_config: Config,
) -> None:
    k = replace(kafka_config.kafka, partitions=1)
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    check = BrokerStableCheck(k)
    try:
        check.ask([k.results_topic])
        answer = check.wait(30)
        assert answer is not None and answer.held == frozenset()
        producer = clients.producer(k, transactional_id=f"open-{uuid4()}")
        producer.init_transactions(15)
        producer.begin_transaction()
        producer.produce(k.results_topic, b"answer", _key(1, "open"))
        producer.flush(15)
        asked = time.monotonic()
        check.ask([k.results_topic])
        answer = check.wait(30)
        assert answer is not None and answer.asked >= asked
        assert answer.held == {(k.results_topic, 1)}
        producer.commit_transaction(15)
        check.ask([k.results_topic])
        answer = check.wait(30)
        assert answer is not None and answer.held == frozenset()
    finally:
        check.close()


def test_a_worker_giving_its_producer_up_mid_chain_leaves_its_answer_visible(
    kafka_config: Config,
) -> None:
    """The chain of the test above, but the worker loses its last partition while the
    other two transactions are still open, and the next owner claims its id (a new
    epoch) once they have ended: a transaction the broker had not completed under the old
    epoch was left so for good, since only a later transaction on its partition could
    complete it. The worker settles before it gives its producer up (SETTLE_CLOSE_S)."""
    k = replace(kafka_config.kafka, partitions=1)
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    prefix = f"chain-{uuid4()}"

    def publisher(tracker: OffsetTracker) -> TransactionalPublisher:
        return TransactionalPublisher(
            k,
            clients.consumer(k),
            tracker,
            clients.Producers(k, 1_000_000),
            prefix,
            BrokerStableCheck(k),
        )

    tracker = OffsetTracker()
    worker = publisher(tracker)
    origin: Partition = (k.requests_topic, 0)
    worker.assign([origin])
    second, third = (clients.producer(k, transactional_id=f"other-{uuid4()}") for _ in range(2))
    for other in (second, third):
        other.init_transactions(15)
        other.begin_transaction()
    first, seconds, last = _key(0, "first"), [_key(0, "second"), _key(1, "second")], _key(1, "3")
    for key in seconds:
        second.produce(k.results_topic, b"answer", key)
    second.flush(15)
    tracker.add(origin, 0)
    worker.send(k.results_topic, first, b"answer", [], origin, partial(tracker.done, origin, 0))
    worker.commit()  # ends while the second is open: not completed
    third.produce(k.results_topic, b"answer", last)
    third.flush(15)

    def end_the_others() -> None:
        time.sleep(0.5)  # the worker is giving its producer up meanwhile
        second.commit_transaction(15)  # ends while the third is open
        third.commit_transaction(15)  # completes itself and the second, not the worker's

    ending = threading.Thread(target=end_the_others)
    ending.start()
    try:
        worker.revoke([origin])
    finally:
        ending.join(30)
    successor = publisher(OffsetTracker())
    successor.assign([origin])  # claims the worker's id: a new epoch
    try:
        records = read_topic(kafka_config, k.results_topic, 4, timeout_s=15)
        assert sorted(m.key() or b"" for m in records) == sorted([first, *seconds, last])
    finally:
        successor.close()


#: A result is visible within SETTLE_MAX_GAP_S of the end of the last transaction
#: overlapping it (worker/kafka/transactions.py); the rest is room for a busy 2-core machine
#: to run the transactions and the reader
VISIBLE_BOUND_S = SETTLE_MAX_GAP_S + 15.0
_GATE_S = 30.0


@dataclass
class _GatedProducers:
    """:class:`clients.Producers` whose transactional producers flush their records to the
    broker and then wait at ``commit_transaction`` until the test opens their gate, so that
    several workers' transactions are open at the broker at once."""

    inner: clients.Producers
    gate: threading.Event = field(default_factory=threading.Event)
    produced: threading.Event = field(default_factory=threading.Event)

    @property
    def max_message_bytes(self) -> int:
        return self.inner.max_message_bytes

    def limit(self, topic: str) -> RecordLimit:
        return self.inner.limit(topic)

    def __call__(self, transactional_id: str | None = None) -> KafkaProducer:
        return cast(KafkaProducer, _Gated(self.inner(transactional_id), self))


class _Gated:
    """A producer whose ``commit_transaction`` waits for its :class:`_GatedProducers` gate."""

    def __init__(self, producer: KafkaProducer, gates: _GatedProducers) -> None:
        self._producer = producer
        self._gates = gates

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._producer.flush(_GATE_S)  # the records are at the broker: the transaction overlaps
        self._gates.produced.set()
        assert self._gates.gate.wait(_GATE_S), "the test never opened the gate"
        self._producer.commit_transaction(timeout)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_three_overlapping_workers_ending_in_any_order_all_become_visible(
    kafka_config: Config, order: tuple[int, ...]
) -> None:
    """Three workers' transactions open at once in a chain (the first writes results
    partition 0, the second 0 and 1, the third 1), ended in ``order``; then the workers
    are idle, stepped as their loops would: every result is visible within
    :data:`VISIBLE_BOUND_S`."""
    k = replace(kafka_config.kafka, partitions=3, commit_interval_ms=1)
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    writes = [[_key(0, "w0")], [_key(0, "w1"), _key(1, "w1")], [_key(1, "w2")]]
    workers = []
    for number, keys in enumerate(writes):
        producers = _GatedProducers(clients.Producers(k, 1_000_000))
        tracker = OffsetTracker()
        consumer = clients.consumer(k)
        publisher = TransactionalPublisher(
            k, consumer, tracker, producers, f"w{number}-{uuid4()}", BrokerStableCheck(k)
        )
        origin: Partition = (k.requests_topic, number)
        publisher.assign([origin])
        for offset, key in enumerate(keys):
            tracker.add(origin, offset)
            done = partial(tracker.done, origin, offset)
            publisher.send(k.results_topic, key, b"answer", [], origin, done, offset)
        publisher.maybe_commit(time.monotonic())  # handed over: produced, then at the gate
        workers.append((publisher, producers, consumer))
    try:
        for _, producers, _ in workers:
            assert producers.produced.wait(_GATE_S), "a transaction never reached the broker"
        for number in order:
            publisher, producers, _ = workers[number]
            producers.gate.set()
            publisher.commit()  # waits for the transaction to end
        for _, producers, _ in workers:
            producers.gate.set()  # every later transaction (settling) passes at once
        reader_ = reader(kafka_config, k.results_topic)
        seen: list[bytes] = []
        deadline = time.monotonic() + VISIBLE_BOUND_S
        expected = sorted(key for keys in writes for key in keys)
        while sorted(seen) != expected:
            assert time.monotonic() < deadline, f"visible after {VISIBLE_BOUND_S} s: {seen}"
            for publisher, _, _ in workers:  # the idle loops
                publisher.poll()
                publisher.maybe_commit(time.monotonic(), idle=True)
            seen += [m.key() or b"" for m in reader_.consume(100, 0.1) if m.error() is None]
        reader_.close()
    finally:
        for publisher, producers, consumer in workers:
            producers.gate.set()
            publisher.close()
            consumer.close()
