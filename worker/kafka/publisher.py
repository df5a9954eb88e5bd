"""publish → commit: results out, offsets in, under one of two delivery guarantees.

``exactly_once`` (default, :mod:`worker.kafka.transactions`): every answer given since the
last commit, and the consumer offsets they advance, are written in one Kafka transaction
of the worker's one transactional producer, committed every ``commit_interval_ms`` by a
committer thread (:mod:`worker.kafka.committer`).

``at_least_once`` (:class:`AtLeastOncePublisher`): one idempotent producer; a record
counts as answered once the broker acknowledged its answer, and offsets are committed on
the same interval, on a thread of their own. A delivery that failed for a retriable
reason is sent again; a crash repeats, never loses.

What each Kafka error means is decided in :mod:`worker.kafka.failures`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.kafka.consumer import KafkaConsumer, resume_points
from worker.kafka.failures import (
    ATTEMPTS,
    Abortable,
    FatalKafkaError,
    GenerationLost,
    MessageTooLarge,
    TransactionAborted,
    kind,
    produce_checked,
)
from worker.kafka.produce import Headers, ProducerFactory, RecordLimits, record_size

__all__ = [
    "AtLeastOncePublisher",
    "FatalKafkaError",
    "GenerationLost",
    "MessageTooLarge",
    "OnAnswered",
    "Publisher",
    "TransactionAborted",
]

log = logging.getLogger(__name__)

OnAnswered = Callable[[], None]
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Outgoing:
    """One record to produce, kept for as long as it may have to be produced again."""

    topic: str
    key: bytes | str | None
    value: bytes
    headers: tuple[tuple[str, bytes | str | None], ...]


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
        offset: int | None = None,
        on_taken: OnAnswered | None = None,
    ) -> None:
        """Publish one answer to the record at ``offset`` of ``origin``; ``on_answered``
        runs once it counts as answered (the caller marks the record done in the offset
        tracker there), ``on_taken`` (when given) once the publisher holds the answer, at
        or before that: the record's prefetch slot is free from there, the answers held
        being bounded by :meth:`full` instead. Under exactly-once the answer reaches the
        results topic with the next commit, whatever is unanswered ahead of ``offset``: its
        progress record tells the partition's next owner it is answered.

        Raises :class:`MessageTooLarge` (nothing sent; send something smaller) or
        :class:`FatalKafkaError` (exit).
        """

    def full(self) -> bool:
        """Answers buffered up to a bound (``kafka.max_buffered_answers`` or ``_bytes``):
        admit no new record until a commit releases some."""
        return False

    @abstractmethod
    def commit(self) -> None:
        """Commit now what is answered. This, :meth:`poll` and :meth:`maybe_commit` raise
        :class:`TransactionAborted` (the partitions whose records since their last commit
        must be consumed again) or :class:`FatalKafkaError` (exit)."""

    @abstractmethod
    def poll(self) -> None:
        """Serve delivery callbacks, and take the outcome of commits that ended."""

    @abstractmethod
    def assign(self, partitions: Collection[Partition]) -> None:
        """Input partitions this worker now owns."""

    def revoke(self, partitions: Collection[Partition]) -> None:
        """Input partitions handed over cleanly: commit what is answered."""
        self.commit()

    def resume(self, partitions: Collection[Partition], timeout_s: float) -> list[TopicPartition]:
        """Where to read ``partitions`` from now that they are this worker's (assigned, or
        rewound after an abort): the group's committed offsets
        (:func:`~worker.kafka.consumer.resume_points`, whose errors it raises)."""
        return resume_points(self._consumer, partitions, timeout_s)

    def rewind(self, partitions: Collection[Partition]) -> None:
        """Seek ``partitions`` back to where they resume (after an abort)."""
        for tp in self.resume(partitions, TIMEOUT_S):
            self._consumer.seek(tp)

    @abstractmethod
    def lost(self, partitions: Collection[Partition]) -> None:
        """Input partitions lost (another owner may have them already): commit nothing."""

    @abstractmethod
    def forget(self, partitions: Collection[Partition]) -> None:
        """``partitions`` were rewound, revoked or lost: answers to their records that are
        still waiting to be sent are dropped (their records are consumed again)."""

    @abstractmethod
    def close(self) -> None:
        """Commit and flush what is pending."""

    def maybe_commit(self, now: float, idle: bool = False) -> None:
        """Commit every ``commit_interval_ms``, or at once when the worker is ``idle``.

        The interval gathers the answers of several batches into one transaction under
        load. With nothing on the engine no more answers are coming before the next batch
        is formed (at light load, ``timeout_ms`` away), and waiting out the interval
        would only add it to every answer's latency (issue 29): what is answered is
        committed now.
        """
        due = now - self._last_commit >= self._interval_s or (idle and self._tracker.advanced())
        if due and self._commit_due():
            self._last_commit = now

    def _commit_due(self) -> bool:
        """The commit of :meth:`maybe_commit`; :meth:`commit` unless a publisher has a
        cheaper one that keeps the same promise. False: not now (asked again next step)."""
        self.commit()
        return True

    def _committable(self, partitions: Collection[Partition] | None = None) -> list[TopicPartition]:
        return [
            TopicPartition(t, p, o)
            for (t, p), o in self._tracker.committable().items()
            if partitions is None or (t, p) in partitions
        ]

    def _mark(self, offsets: Sequence[TopicPartition]) -> None:
        self._tracker.mark_committed({(tp.topic, tp.partition): tp.offset for tp in offsets})


class AtLeastOncePublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        producers: ProducerFactory,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._limit = RecordLimits(producers)
        self._producer = producers()
        self._again: deque[tuple[Outgoing, OnAnswered, int, int]] = deque()
        self._undelivered = 0  # answers sent, not acknowledged yet (and their bytes)
        self._undelivered_bytes = 0
        self._failure: KafkaError | None = None
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="offsets")
        self._committing: Future[list[TopicPartition]] | None = None

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
        offset: int | None = None,
        on_taken: OnAnswered | None = None,
    ) -> None:
        size = record_size(key, value, headers)
        self._send(Outgoing(topic, key, value, tuple(headers)), on_answered, 1, size)
        # held until delivered: the slot is free, the undelivered answers are bounded
        self._undelivered += 1
        self._undelivered_bytes += size
        if on_taken is not None:
            on_taken()

    def full(self) -> bool:
        return (
            self._undelivered >= self._kafka.max_buffered_answers
            or self._undelivered_bytes >= self._kafka.max_buffered_bytes
        )

    def _send(self, record: Outgoing, on_answered: OnAnswered, attempt: int, size: int) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self._undelivered -= 1
                self._undelivered_bytes -= size
                on_answered()
            elif kind(err) == "retriable" and attempt < ATTEMPTS:
                # the idempotent producer gave up after message.timeout.ms: send it again
                # (from poll(), not from inside librdkafka's callback)
                log.warning("delivery to %s failed (%s); sending again", record.topic, err)
                self._again.append((record, on_answered, attempt + 1, size))
            elif self._failure is None:
                self._failure = err

        r = record
        try:
            produce_checked(
                self._producer,
                self._limit(r.topic),
                r.topic,
                r.key,
                r.value,
                r.headers,
                delivered,
                size,
            )
        except Abortable as exc:  # no transaction here: a state librdkafka should not reach
            raise FatalKafkaError(str(exc)) from exc

    def poll(self) -> None:
        self._producer.poll(0)
        while self._again:
            self._send(*self._again.popleft())
        if self._failure is not None:
            # not retriable, or retried enough: uncommitted offsets make the restarted
            # worker answer again
            raise FatalKafkaError(f"a result could not be delivered: {self._failure}")

    def commit(self) -> None:
        """Wait for every answer sent to be delivered, then commit (a revoke, shutdown)."""
        self._producer.flush(TIMEOUT_S)
        self._take()
        self.poll()
        offsets = self._committable()
        if offsets:
            self._mark(self._commit_offsets(offsets))
            self.commits += 1

    def _commit_due(self) -> bool:
        # an answer counts once delivered, and only then may its offset be committed, so
        # the interval's commit need not wait for those still on their way: they are
        # committed next time (a flush here held the loop for a broker round trip on
        # every interval, issue 25). The commit itself runs on a thread of its own, one
        # at a time: synchronous on the loop it held every step behind the group
        # coordinator's answer, and at-least-once ran at 0.88x exactly-once (issue 40)
        if self._committing is not None and not self._committing.done():
            return False
        self._take()
        self.poll()
        offsets = self._committable()
        if offsets:
            self._committing = self._committer.submit(self._commit_offsets, offsets)
        return True

    def _take(self) -> None:
        """Wait for the commit in flight and take its outcome (:class:`GenerationLost`)."""
        committing, self._committing = self._committing, None
        if committing is not None:
            self._mark(committing.result())
            self.commits += 1

    def _commit_offsets(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if kind(exc.args[0]) == "lost":  # refused by generation: partitions gone
                raise GenerationLost(f"commit: {exc.args[0]}") from exc
            raise
        return offsets

    def assign(self, partitions: Collection[Partition]) -> None:
        """One producer serves every partition."""

    def lost(self, partitions: Collection[Partition]) -> None:
        """Nothing to undo: uncommitted offsets are answered again by the new owner (a
        commit in flight that is refused is dropped)."""
        try:
            self._take()
        except (GenerationLost, KafkaException) as exc:
            log.info("lost %s: the commit in flight failed (%s)", sorted(partitions), exc)

    def forget(self, partitions: Collection[Partition]) -> None:
        """Nothing waits here: every answer was produced when it was sent."""

    def close(self) -> None:
        self._producer.flush(TIMEOUT_S)
        try:
            self._take()
        finally:
            self._committer.shutdown(wait=True)
