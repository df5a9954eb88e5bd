"""The committer thread: every call on the worker's one transactional producer.

The loop hands over (:meth:`Committer.hand`) what it answered since the last commit — the
records, the consumer offsets they advance and the group metadata of the moment — and goes
on; this thread begins a transaction, produces the records, sends the offsets
(``send_offsets_to_transaction``, KIP-447) and commits. One handover at a time: the loop
asks for the outcome (:meth:`Committer.outcome`) before it hands over the next, so answers
given while a commit runs go into the next transaction.

A transaction that must be aborted is aborted and done again — its records produced anew,
nothing lost, the aborted copies invisible to read_committed readers — up to
:data:`REPLAYS` times; then the outcome is :class:`TransactionAborted` for the partitions
whose answers it held, which the loop consumes again. Retriable errors are retried in
:func:`~worker.kafka.failures.call`. A fenced producer or a refused group generation is
:class:`GenerationLost` (the transaction is aborted where the producer still can, and the
producer is dropped); a fatal error is :class:`FatalKafkaError`.

Answers are produced without a delivery callback: inside a transaction a failed delivery
leaves it abortable, which ``send_offsets_to_transaction`` and ``commit_transaction``
report; their sizes were checked once, when they were answered
(:meth:`TransactionalPublisher.send`). A handover with progress records
(:mod:`worker.kafka.progress`) is flushed before its offsets are sent: the delivery
reports of the progress records give their offsets, and the pointers to them go out with
the input offsets only once every record of the transaction is acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from batcher import Partition
from worker.kafka.failures import (
    Abortable,
    FatalKafkaError,
    GenerationLost,
    TransactionAborted,
    call,
    produce_checked,
)
from worker.kafka.outcome import TxOutcome
from worker.kafka.produce import KafkaProducer
from worker.kafka.progress import ProgressRecord
from worker.kafka.publisher import TIMEOUT_S, Outgoing
from worker.wire.progress import CONTENT_TYPE

log = logging.getLogger(__name__)

#: new transactions that redo an aborted one before its partitions' records are read again
REPLAYS = 3


@dataclass(frozen=True)
class Handover:
    """One transaction's worth: answers, the input partitions they answer, and offsets."""

    records: tuple[Outgoing, ...]
    origins: frozenset[Partition]
    offsets: tuple[TopicPartition, ...]
    metadata: Any  # consumer.consumer_group_metadata() when it was handed over
    #: one record per input partition moved or answered, and the topic they go to
    progress: tuple[ProgressRecord, ...] = ()
    progress_topic: str = ""


class Committer:
    """One transactional producer (``init_transactions`` done here) and its thread."""

    def __init__(
        self,
        producer: KafkaProducer,
        transactional_id: str,
        on_outcome: Callable[[TxOutcome], None],
    ) -> None:
        self.transactional_id = transactional_id
        self._producer = producer
        self._on_outcome = on_outcome
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="committer")
        self._inflight: Future[tuple[TopicPartition, ...]] | None = None
        call(producer.init_transactions, TIMEOUT_S)

    @property
    def busy(self) -> bool:
        """A handover is being committed."""
        return self._inflight is not None and not self._inflight.done()

    @property
    def pending(self) -> bool:
        """A handover was made whose outcome was not asked for yet."""
        return self._inflight is not None

    def hand(self, handover: Handover) -> None:
        assert self._inflight is None, "the last handover's outcome was not asked for"
        self._inflight = self._thread.submit(self._transact, handover)

    def outcome(self) -> tuple[TopicPartition, ...]:
        """Wait for the handover in flight, if any: returns once it is committed (the
        pointers it committed to its progress records), raises :class:`TransactionAborted`
        or :class:`FatalKafkaError` otherwise."""
        inflight, self._inflight = self._inflight, None
        return () if inflight is None else inflight.result()

    def close(self, flush: bool = True) -> None:
        """Stop the thread (after the handover in flight); ``flush`` the producer."""
        self._thread.shutdown(wait=True)
        if flush:
            self._producer.flush(TIMEOUT_S)

    def _transact(self, handover: Handover) -> tuple[TopicPartition, ...]:
        reason = ""
        for _ in range(REPLAYS + 1):
            try:
                pointers = self._once(handover)
                self._on_outcome("commit")
                return pointers
            except Abortable as exc:
                reason = str(exc)
                log.warning("aborting a transaction of %s: %s", self.transactional_id, reason)
                self._on_outcome("abort")
                call(self._producer.abort_transaction, TIMEOUT_S)
            except GenerationLost:
                self._on_outcome("abort")
                self._abort_quietly()
                raise
        raise TransactionAborted(handover.origins, f"{reason} ({REPLAYS} replays failed too)")

    def _once(self, handover: Handover) -> tuple[TopicPartition, ...]:
        p = self._producer
        call(p.begin_transaction)
        for r in handover.records:
            produce_checked(p, None, r.topic, r.key, r.value, r.headers)
        pointers = self._progress(handover)
        # every transaction of the worker sends offsets (the handover re-sends the committed
        # ones when nothing moved): the broker checks the group generation there (KIP-447),
        # so a worker whose generation is over cannot commit
        if handover.offsets or pointers:
            offsets = list(handover.offsets) + list(pointers)
            call(p.send_offsets_to_transaction, offsets, handover.metadata, TIMEOUT_S)
        call(p.commit_transaction, TIMEOUT_S)
        p.poll(0)  # serves the delivery reports (no Python callback runs): they are queued
        return pointers

    def _progress(self, handover: Handover) -> tuple[TopicPartition, ...]:
        """Produce the progress records and wait until every record of the transaction is
        acknowledged; the pointers to them (one past each record's offset). Raises
        :class:`Abortable` where a delivery failed: no pointer may name a record that
        covers an answer not written (module doc)."""
        if not handover.progress:
            return ()
        p, topic = self._producer, handover.progress_topic
        placed: dict[int, int] = {}
        failed: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                placed[msg.partition()] = msg.offset()
            else:
                failed.append(err)  # formatted later: librdkafka may hold an error now

        for record in handover.progress:
            headers = [("content-type", CONTENT_TYPE)]
            produce_checked(
                p,
                None,
                topic,
                record.key,
                record.value,
                headers,
                delivered,
                partition=record.origin[1],
            )
        left = call(_flush, p)
        wanted = {record.origin[1] for record in handover.progress}
        if left or failed or set(placed) != wanted:
            raise Abortable(
                f"progress records not acknowledged ({left} left, failures {failed[:3]})"
            )
        return tuple(TopicPartition(topic, n, offset + 1) for n, offset in sorted(placed.items()))

    def _abort_quietly(self) -> None:
        """Abort what a lost generation left open, where the producer still can (a refused
        generation leaves it abortable; a fenced one refuses, and its successor's
        ``init_transactions`` aborted it already)."""
        try:
            call(self._producer.abort_transaction, TIMEOUT_S)
        except (Abortable, FatalKafkaError, GenerationLost) as exc:
            log.info("%s: nothing more to abort (%s)", self.transactional_id, exc)


def _flush(producer: KafkaProducer) -> int:
    """``flush``, with librdkafka's error as a ``KafkaException``: confluent-kafka runs the
    progress records' delivery callbacks while a fatal error it is about to raise (a fenced
    producer) is pending, and the first C call in the callback then fails as a
    ``SystemError`` whose context is that error."""
    try:
        return producer.flush(TIMEOUT_S)
    except SystemError as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KafkaException):
            raise cause from exc
        raise
