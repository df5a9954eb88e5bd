"""publish → commit: results out, offsets in, under one of two delivery guarantees.

``exactly_once`` (default): results and the consumer offsets they answer are written in
one Kafka transaction, committed every ``commit_interval_ms``. A crash before the
commit leaves neither the results nor the offsets; after it, both. Offsets never pass
an unanswered request (:class:`batcher.OffsetTracker`), so results that complete out of
order beyond a slower request may be produced again after a crash: readers join on
``custom_id`` (``collect`` keeps one line per id).

``at_least_once``: an idempotent producer; a request's offset counts as answered only
once its result is acknowledged by the broker, and offsets are committed on the same
interval. A crash repeats, never loses.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from batcher import OffsetTracker, Partition
from worker import clients
from worker.config import KafkaConfig

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | str | None]]
OnAnswered = Callable[[], None]
_TIMEOUT_S = 30.0
_FENCED = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


class FatalKafkaError(RuntimeError):
    """The producer cannot go on (fenced by a newer instance, fatal error): exit, restart."""


class TransactionAborted(RuntimeError):
    """The open transaction was aborted: everything since the last commit is undone."""


class Publisher(ABC):
    """Produces answers and commits the offsets of answered records."""

    def __init__(self, kafka: KafkaConfig, consumer: Consumer, tracker: OffsetTracker) -> None:
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
        on_answered: OnAnswered,
    ) -> None:
        """Publish one answer; ``on_answered`` runs once it counts as answered.

        The caller marks the record answered in the offset tracker from ``on_answered``.
        """

    @abstractmethod
    def commit(self) -> None:
        """Commit now what is answered."""

    @abstractmethod
    def lost(self) -> None:
        """The assignment was lost (not cleanly revoked): nothing may be committed."""

    def poll(self) -> None:
        """Serve delivery callbacks."""
        self._producer.poll(0)

    def maybe_commit(self, now: float) -> None:
        if now - self._last_commit >= self._interval_s:
            self.commit()
            self._last_commit = now

    def close(self, timeout_s: float = _TIMEOUT_S) -> None:
        self._producer.flush(timeout_s)

    _producer: Producer

    def _produce(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=list(headers), on_delivery=on_delivery
                )
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)
            except KafkaException as exc:
                raise FatalKafkaError(f"produce to {topic} failed: {exc}") from exc

    def _offsets(self) -> list[TopicPartition]:
        return [TopicPartition(t, p, o) for (t, p), o in self._tracker.committable().items()]


class AtLeastOncePublisher(Publisher):
    def __init__(self, kafka: KafkaConfig, consumer: Consumer, tracker: OffsetTracker) -> None:
        super().__init__(kafka, consumer, tracker)
        self._producer = clients.producer(kafka)
        self._failure: KafkaError | None = None

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        on_answered: OnAnswered,
    ) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._failure = err
                return
            on_answered()

        self._produce(topic, key, value, headers, delivered)

    def poll(self) -> None:
        super().poll()
        if self._failure is not None:
            # the idempotent producer already retried for delivery.timeout.ms: give up,
            # uncommitted offsets make the restarted worker answer again
            raise FatalKafkaError(f"a result could not be delivered: {self._failure}")

    def commit(self) -> None:
        self._producer.flush(_TIMEOUT_S)
        self.poll()
        offsets = self._offsets()
        if not offsets:
            return
        self._consumer.commit(offsets=offsets, asynchronous=False)
        self._tracker.mark_committed({(tp.topic, tp.partition): tp.offset for tp in offsets})
        self.commits += 1

    def lost(self) -> None:
        """Nothing to undo: uncommitted offsets are simply answered again by the new owner."""


class TransactionalPublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: Consumer,
        tracker: OffsetTracker,
        transactional_id: str,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._producer = clients.producer(kafka, transactional_id=transactional_id)
        self._in_txn = False
        self._call(self._producer.init_transactions, _TIMEOUT_S)

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        on_answered: OnAnswered,
    ) -> None:
        if not self._in_txn:
            self._call(self._producer.begin_transaction)
            self._in_txn = True
        self._produce(topic, key, value, headers, _ignore_delivery)
        # inside a transaction a result counts as given once produced: the commit makes
        # it and its offset visible together, an abort undoes both
        on_answered()

    def commit(self) -> None:
        if not self._in_txn:
            return
        offsets = self._offsets()
        if offsets:
            self._call(
                self._producer.send_offsets_to_transaction,
                offsets,
                self._consumer.consumer_group_metadata(),
                _TIMEOUT_S,
            )
        self._call(self._producer.commit_transaction, _TIMEOUT_S)
        self._in_txn = False
        self.commits += 1
        if offsets:
            self._tracker.mark_committed({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def lost(self) -> None:
        if self._in_txn:
            self._abort()

    def close(self, timeout_s: float = _TIMEOUT_S) -> None:
        if self._in_txn:
            self.commit()
        super().close(timeout_s)

    def _abort(self) -> None:
        self._in_txn = False
        self.aborts += 1
        try:
            self._producer.abort_transaction(_TIMEOUT_S)
        except KafkaException as exc:
            raise FatalKafkaError(f"abort_transaction failed: {exc.args[0]}") from exc

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Retry what is retriable; abort what must be; fail on what is fatal."""
        for attempt in range(5):
            try:
                return fn(*args)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.fatal() or error.code() in _FENCED:
                    # a newer instance with our transactional.id took over: this one is a
                    # zombie and must stop; the supervisor restarts it
                    raise FatalKafkaError(f"{fn.__name__} failed: {error}") from exc
                if error.retriable() and attempt < 4:
                    log.warning("retrying %s after %s", fn.__name__, error)
                    time.sleep(0.2 * (attempt + 1))
                    continue
                if error.txn_requires_abort():
                    log.warning("aborting transaction after %s", error)
                    self._abort()
                    raise TransactionAborted(str(error)) from exc
                raise FatalKafkaError(f"{fn.__name__} failed: {error}") from exc
        raise AssertionError("unreachable")


def _ignore_delivery(err: KafkaError | None, _msg: Message) -> None:
    # errors inside a transaction surface again, and fatally, at commit_transaction
    if err is not None:
        log.warning("transactional delivery failed: %s", err)


def rewind(consumer: Consumer, partitions: Collection[Partition]) -> None:
    """Seek ``partitions`` back to their committed offsets (after an abort)."""
    committed = consumer.committed(
        [TopicPartition(t, p) for t, p in partitions], timeout=_TIMEOUT_S
    )
    for tp in committed:
        if tp.offset < 0:
            tp.offset = -2  # OFFSET_BEGINNING: nothing committed yet, start over
        consumer.seek(tp)
