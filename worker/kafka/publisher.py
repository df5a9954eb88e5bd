"""publish → commit: results out, offsets in, under one of two delivery guarantees.

``exactly_once`` (default): the results answering records of an input partition, and that
partition's consumer offsets, are written in one Kafka transaction, committed every
``commit_interval_ms``. A crash before the commit leaves neither; after it, both. Each
assigned input partition has its own transactional producer, ``transactional.id`` =
``<prefix>.<topic>.<partition>``: whoever owns a partition next fences the previous owner
(a zombie cannot commit) and aborts the transaction it left open at once — rather than
after ``transaction.timeout.ms`` on Apache Kafka, or never on brokers that do not time
transactions out (Tansu), while that open transaction holds back every read_committed
reader of the results topic. Offsets never pass an unanswered request
(:class:`batcher.OffsetTracker`), so results that complete out of order beyond a slower
request may be produced again after a crash: readers join on ``custom_id`` (``collect``
keeps one line per id).

``at_least_once``: one idempotent producer; a record counts as answered once the broker
acknowledged its answer, and offsets are committed on the same interval. A crash repeats,
never loses.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.errors import BatchpipeError, ErrorCode
from worker.kafka.consumer import KafkaConsumer
from worker.kafka.produce import (
    Headers,
    KafkaProducer,
    OnDelivery,
    ProducerFactory,
    produce,
    record_size,
)
from worker.obs.metrics import TxOutcome

log = logging.getLogger(__name__)

OnAnswered = Callable[[], None]
_TIMEOUT_S = 30.0
_FENCED = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class FatalKafkaError(BatchpipeError, RuntimeError):
    """The producer cannot go on (fenced by a newer owner, fatal error): exit, restart."""


class MessageTooLarge(BatchpipeError, ValueError):
    """A record bigger than the producer's ``message.max.bytes``: refused before it was
    sent, and nothing else is affected. The caller sends something smaller instead."""

    code = ErrorCode.OVER_LIMIT

    def __init__(self, topic: str, size: int, limit: int) -> None:
        super().__init__(
            f"a record of {size} bytes for {topic} is over the producer's "
            f"message.max.bytes ({limit})"
        )
        self.size = size
        self.limit = limit


class TransactionAborted(BatchpipeError, RuntimeError):
    """A transaction was aborted: what it held for ``partitions`` since their last commit
    is undone, and those records must be consumed again."""

    def __init__(self, partitions: Collection[Partition], reason: str) -> None:
        super().__init__(f"transaction for {sorted(partitions)} aborted: {reason}")
        self.partitions = list(partitions)


class Publisher(ABC):
    """Produces answers and commits the offsets of answered records."""

    def __init__(self, kafka: KafkaConfig, consumer: KafkaConsumer, tracker: OffsetTracker) -> None:
        self._kafka = kafka
        self._consumer = consumer
        self._tracker = tracker
        self._interval_s = kafka.commit_interval_ms / 1000.0
        self._last_commit = time.monotonic()
        self.commits = 0
        self.aborts = 0

    @abstractmethod
    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
    ) -> None:
        """Publish one answer to a record of ``origin``; ``on_answered`` runs once it counts
        as answered (the caller marks the record done in the offset tracker there)."""

    @abstractmethod
    def commit(self) -> None:
        """Commit now what is answered."""

    @abstractmethod
    def poll(self) -> None:
        """Serve delivery callbacks."""

    @abstractmethod
    def assign(self, partitions: Collection[Partition]) -> None:
        """Input partitions this worker now owns."""

    def revoke(self, partitions: Collection[Partition]) -> None:
        """Input partitions handed over cleanly: commit what is answered."""
        self.commit()

    @abstractmethod
    def lost(self, partitions: Collection[Partition]) -> None:
        """Input partitions lost (another owner may have them already): commit nothing."""

    @abstractmethod
    def close(self) -> None:
        """Commit and flush what is pending."""

    def maybe_commit(self, now: float) -> None:
        if now - self._last_commit >= self._interval_s:
            self.commit()
            self._last_commit = now

    def _committable(self, partitions: Collection[Partition] | None = None) -> list[TopicPartition]:
        return [
            TopicPartition(t, p, o)
            for (t, p), o in self._tracker.committable().items()
            if partitions is None or (t, p) in partitions
        ]

    def _mark(self, offsets: Sequence[TopicPartition]) -> None:
        self._tracker.mark_committed({(tp.topic, tp.partition): tp.offset for tp in offsets})


def _produce(
    producer: KafkaProducer,
    limit: int,
    topic: str,
    key: bytes | str | None,
    value: bytes,
    headers: Headers,
    on_delivery: OnDelivery,
) -> None:
    try:
        produce(producer, topic, key, value, headers, on_delivery)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
            # librdkafka checks the size before it queues the record: nothing was sent
            raise MessageTooLarge(topic, record_size(key, value, headers), limit) from exc
        raise FatalKafkaError(f"produce to {topic} failed: {exc}") from exc


class AtLeastOncePublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        producers: ProducerFactory,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._limit = producers.max_message_bytes
        self._producer = producers()
        self._failure: KafkaError | None = None

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
    ) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._failure = err
            else:
                on_answered()

        _produce(self._producer, self._limit, topic, key, value, headers, delivered)

    def poll(self) -> None:
        self._producer.poll(0)
        if self._failure is not None:
            # the idempotent producer already retried for delivery.timeout.ms: give up;
            # uncommitted offsets make the restarted worker answer again
            raise FatalKafkaError(f"a result could not be delivered: {self._failure}")

    def commit(self) -> None:
        self._producer.flush(_TIMEOUT_S)
        self.poll()
        offsets = self._committable()
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)
            self._mark(offsets)
            self.commits += 1

    def assign(self, partitions: Collection[Partition]) -> None:
        """One producer serves every partition."""

    def lost(self, partitions: Collection[Partition]) -> None:
        """Nothing to undo: uncommitted offsets are answered again by the new owner."""

    def close(self) -> None:
        self._producer.flush(_TIMEOUT_S)


class _Transactions:
    """One transactional producer and the state of its open transaction."""

    def __init__(self, producers: ProducerFactory, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.limit = producers.max_message_bytes
        self.producer = producers(transactional_id)
        self.open = False
        _call(self.producer.init_transactions, _TIMEOUT_S)

    def produce(self, topic: str, key: bytes | str | None, value: bytes, headers: Headers) -> None:
        if not self.open:
            _call(self.producer.begin_transaction)
            self.open = True
        _produce(self.producer, self.limit, topic, key, value, headers, _log_delivery_error)

    def commit(self, offsets: list[TopicPartition], consumer: KafkaConsumer) -> None:
        if offsets:
            metadata = consumer.consumer_group_metadata()
            _call(self.producer.send_offsets_to_transaction, offsets, metadata, _TIMEOUT_S)
        _call(self.producer.commit_transaction, _TIMEOUT_S)
        self.open = False

    def abort(self) -> None:
        self.open = False
        try:
            self.producer.abort_transaction(_TIMEOUT_S)
        except KafkaException as exc:
            raise FatalKafkaError(f"abort_transaction failed: {exc.args[0]}") from exc


class TransactionalPublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        producers: ProducerFactory,
        prefix: str,
        on_outcome: Callable[[TxOutcome], None] = lambda outcome: None,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._producers = producers
        self._prefix = prefix
        self._on_outcome = on_outcome  # for the transactions metric
        self._owned: dict[Partition, _Transactions] = {}

    def assign(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            if partition not in self._owned:
                topic, number = partition
                txn_id = f"{self._prefix}.{topic}.{number}"
                self._owned[partition] = _Transactions(self._producers, txn_id)

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
    ) -> None:
        txn = self._owned.get(origin)
        if txn is None:
            raise RuntimeError(f"answer for {origin}, which this worker does not own")
        try:
            txn.produce(topic, key, value, headers)
        except _Abortable as exc:
            self._abort([origin], str(exc))
        # inside a transaction a result counts as given once produced: the commit makes
        # it and its offset visible together, an abort undoes both
        on_answered()

    def poll(self) -> None:
        for txn in self._owned.values():
            txn.producer.poll(0)

    def commit(self, partitions: Collection[Partition] | None = None) -> None:
        aborted: list[Partition] = []
        reasons: list[str] = []
        for partition, txn in self._owned.items():
            if not txn.open or (partitions is not None and partition not in partitions):
                continue
            offsets = self._committable([partition])
            try:
                txn.commit(offsets, self._consumer)
            except _Abortable as exc:
                aborted.append(partition)
                reasons.append(str(exc))
                continue
            self.commits += 1
            self._on_outcome("commit")
            self._mark(offsets)
        if aborted:
            self._abort(aborted, "; ".join(reasons))

    def revoke(self, partitions: Collection[Partition]) -> None:
        try:
            self.commit(partitions)
        finally:
            self._release(partitions)

    def lost(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            txn = self._owned.get(partition)
            if txn is not None and txn.open:
                self.aborts += 1
                self._on_outcome("abort")
                txn.abort()
        self._release(partitions)

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._release(list(self._owned))

    def _abort(self, partitions: Collection[Partition], reason: str) -> None:
        for partition in partitions:
            self.aborts += 1
            self._on_outcome("abort")
            self._owned[partition].abort()
        raise TransactionAborted(partitions, reason)

    def _release(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            txn = self._owned.pop(partition, None)
            if txn is not None:
                txn.producer.flush(_TIMEOUT_S)


class _Abortable(BatchpipeError, RuntimeError):
    """The transaction must be aborted; the producer itself can go on."""


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Retry what is retriable; signal what must be aborted; fail on what is fatal."""
    attempts = 5
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or error.code() in _FENCED:
                # a newer owner of this transactional.id took over: this producer is a
                # zombie and must stop; the supervisor restarts the worker
                raise FatalKafkaError(f"{fn.__name__} failed: {error}") from exc
            if error.txn_requires_abort():
                raise _Abortable(f"{fn.__name__}: {error}") from exc
            if not error.retriable() or attempt == attempts:
                raise FatalKafkaError(f"{fn.__name__} failed: {error}") from exc
            log.warning("retrying %s after %s", fn.__name__, error)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _log_delivery_error(err: KafkaError | None, _msg: Message) -> None:
    # errors inside a transaction surface again, and decide its fate, at commit_transaction
    if err is not None:
        log.warning("transactional delivery failed: %s", err)


def rewind(consumer: KafkaConsumer, partitions: Collection[Partition]) -> None:
    """Seek ``partitions`` back to their committed offsets (after an abort)."""
    committed = consumer.committed(
        [TopicPartition(t, p) for t, p in partitions], timeout=_TIMEOUT_S
    )
    for tp in committed:
        if tp.offset < 0:
            tp.offset = -2  # OFFSET_BEGINNING: nothing committed yet, start over
        consumer.seek(tp)
