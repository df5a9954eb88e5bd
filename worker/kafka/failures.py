"""What a Kafka error means for the worker, and the one place that decides it.

librdkafka's transactional API sorts its errors (``rdkafka.h``, "Transactional producer
API"). A **lost** generation — the producer fenced by a newer owner of its
``transactional.id`` (``_FENCED``, ``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``: also what
a transaction the coordinator timed out leaves, since Apache Kafka bumps the epoch when it
aborts one), or the group generation refused (``ILLEGAL_GENERATION``,
``UNKNOWN_MEMBER_ID``, ``FENCED_INSTANCE_ID``: KIP-447's check of
``send_offsets_to_transaction``) — means "this worker's partitions are gone": the
producer is dropped and the worker rejoins the group, its engine still loaded
(:class:`GenerationLost`). A **fatal** error (``error.fatal()``) ends the producer, so the
worker exits and is restarted; an
**abortable** one (``txn_requires_abort()``, or ``_STATE`` from ``produce`` once the
transaction is in that state) ends the transaction, which is aborted and may be done again
in a new one; a **retriable** one (``retriable()``, e.g. a timeout in ``commit_transaction``
or ``abort_transaction``, which go on in the background) means calling again. A record over
``message.max.bytes`` is refused before it is sent and harms nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException

from batcher import Partition
from worker.errors import BatchpipeError, ErrorCode
from worker.kafka.produce import (
    Headers,
    KafkaProducer,
    OnDelivery,
    RecordLimit,
    produce,
    record_size,
)

log = logging.getLogger(__name__)

Kind = Literal["lost", "fatal", "abortable", "retriable", "too_large"]

#: how often a call failing with a retriable error is made before the worker gives up
ATTEMPTS = 5
_BACKOFF_S = 0.2
#: the producer or the group member belongs to a generation that is over (module doc)
_LOST = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError._FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
    }
)
#: delivery report errors worth sending the record again: librdkafka reports them by code
#: only, without the ``retriable()`` flag
_RETRIABLE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)


class FatalKafkaError(BatchpipeError, RuntimeError):
    """The producer cannot go on (a fatal error): exit, restart."""


class GenerationLost(BatchpipeError, RuntimeError):
    """This worker's generation of the group is over (fenced, or refused by generation):
    its partitions are lost. Drop the producer, forget the partitions, rejoin the group;
    the engine stays loaded."""


class MessageTooLarge(BatchpipeError, ValueError):
    """A record bigger than the producer's ``message.max.bytes`` or than its topic's
    ``max.message.bytes`` allows: refused before it was sent, and nothing else is
    affected. The caller sends something smaller instead."""

    code = ErrorCode.OVER_LIMIT

    def __init__(self, topic: str, size: int, limit: RecordLimit) -> None:
        super().__init__(f"a record of {size} bytes for {topic} is over {limit.setting}")
        self.size = size
        self.limit = limit.bytes
        self.setting = limit.setting


class TransactionAborted(BatchpipeError, RuntimeError):
    """A transaction was aborted: what it held for ``partitions`` since their last commit
    is undone, and those records must be consumed again."""

    def __init__(self, partitions: Collection[Partition], reason: str) -> None:
        super().__init__(f"transaction for {sorted(partitions)} aborted: {reason}")
        self.partitions = list(partitions)


class Abortable(BatchpipeError, RuntimeError):
    """The transaction must be aborted; the producer itself can go on."""


def kind(error: KafkaError) -> Kind:
    """What ``error`` means for the producer that raised or reported it."""
    code = error.code()
    if code in _LOST:
        return "lost"
    if error.fatal() or code == KafkaError._FATAL:
        return "fatal"
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return "too_large"
    if error.txn_requires_abort() or code == KafkaError._STATE:
        return "abortable"
    if error.retriable() or code in _RETRIABLE_CODES:
        return "retriable"
    return "fatal"


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, retried while retriable; :class:`GenerationLost`, :class:`Abortable` or
    :class:`FatalKafkaError` for what retrying cannot mend."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fn(*args)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            found = kind(error)
            if found == "lost":
                raise GenerationLost(f"{fn.__name__}: {error}") from exc
            if found == "abortable":
                raise Abortable(f"{fn.__name__}: {error}") from exc
            if found != "retriable" or attempt == ATTEMPTS:
                raise FatalKafkaError(f"{fn.__name__} failed: {error}") from exc
            log.warning("retrying %s after %s", fn.__name__, error)
            time.sleep(_BACKOFF_S * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def produce_checked(
    producer: KafkaProducer,
    limit: RecordLimit | None,
    topic: str,
    key: bytes | str | None,
    value: bytes,
    headers: Headers,
    on_delivery: OnDelivery | None = None,
    size: int | None = None,
    partition: int | None = None,
) -> None:
    """:func:`~worker.kafka.produce.produce`, its failures sorted: :class:`MessageTooLarge`,
    :class:`GenerationLost`, :class:`Abortable` or :class:`FatalKafkaError`; retriable ones
    are tried again.

    A record over ``limit`` is refused here, before librdkafka sees it: librdkafka itself
    knows only its own ``message.max.bytes``, not a topic's smaller ``max.message.bytes``.
    ``limit`` None: the caller checked the record's size already (the committer's records
    were checked when they were answered: counted once, on the loop). ``size``: the
    record's :func:`~worker.kafka.produce.record_size`, where the caller counted it;
    ``partition``: where it goes, else where its key's hash puts it."""
    if limit is not None:
        if size is None:
            size = record_size(key, value, headers)
        if size > limit.bytes:
            raise MessageTooLarge(topic, size, limit)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            produce(producer, topic, key, value, headers, on_delivery, partition)
            return
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            found = kind(error)
            if found == "too_large":
                # librdkafka checks the size before it queues the record: nothing was sent
                if limit is None or size is None:
                    raise FatalKafkaError(f"librdkafka refused a checked record: {error}") from exc
                raise MessageTooLarge(topic, size, limit) from exc
            if found == "lost":
                raise GenerationLost(f"produce to {topic}: {error}") from exc
            if found == "abortable":
                raise Abortable(f"produce to {topic}: {error}") from exc
            if found != "retriable" or attempt == ATTEMPTS:
                raise FatalKafkaError(f"produce to {topic} failed: {error}") from exc
            log.warning("retrying produce to %s after %s", topic, error)
            producer.poll(_BACKOFF_S * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")
