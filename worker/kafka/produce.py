"""One produce call that waits out a full local queue, for every producer in batchpipe.

:class:`KafkaProducer` is the producer surface batchpipe uses, as a structural type:
confluent-kafka's ``Producer`` satisfies it as it is, and so does the in-memory fake of
the unit tests (``tests/unit/worker/fakes.py``). A new call on a producer is added here
first, and the fake then has to model it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, TopicPartition

Headers = Sequence[tuple[str, bytes | str | None]]
OnDelivery = Callable[[KafkaError | None, Message], None]

#: how long to serve delivery reports before retrying a produce refused for a full queue
_DRAIN_S = 0.1


class KafkaProducer(Protocol):
    """An idempotent producer, transactional when it was built with a ``transactional.id``."""

    def produce(
        self,
        topic: str,
        value: bytes | None = ...,
        key: bytes | str | None = ...,
        *,
        on_delivery: OnDelivery | None = ...,
        headers: list[tuple[str, bytes | str | None]] | None = ...,
        partition: int = ...,
    ) -> None: ...
    def poll(self, timeout: float = ...) -> int: ...
    def flush(self, timeout: float = ...) -> int: ...
    def init_transactions(self, timeout: float = ...) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = ...
    ) -> None: ...
    def commit_transaction(self, timeout: float = ...) -> None: ...
    def abort_transaction(self, timeout: float = ...) -> None: ...


#: what a record batch adds to the records in it, beyond what librdkafka counts per record
BATCH_FRAMING_BYTES = 1024


@dataclass(frozen=True)
class RecordLimit:
    """The most bytes (:func:`record_size`) a record may have on one topic, and why."""

    bytes: int
    #: the setting that sets it, as an error message names it
    setting: str


def record_limit(producer_max: int, topic: str, topic_max: Mapping[str, int]) -> RecordLimit:
    """The limit of a record for ``topic``: the producers' ``message.max.bytes``, or less
    where the topic's ``max.message.bytes`` (``topic_max``, as the broker described it)
    leaves less room for one record and its batch framing. librdkafka checks only the
    former; a broker refuses a batch over the latter after the fact, as a failed delivery."""
    allowed = topic_max.get(topic)
    if allowed is None or allowed - BATCH_FRAMING_BYTES >= producer_max:
        return RecordLimit(producer_max, f"the producer's message.max.bytes ({producer_max})")
    room = max(allowed - BATCH_FRAMING_BYTES, 0)
    return RecordLimit(
        room,
        f"the {room} bytes {topic}'s max.message.bytes ({allowed}) leaves for one record",
    )


class RecordLimits:
    """:meth:`ProducerFactory.limit` per topic, worked out once: it is asked per record."""

    def __init__(self, producers: ProducerFactory) -> None:
        self._of = producers.limit
        self._known: dict[str, RecordLimit] = {}

    def __call__(self, topic: str) -> RecordLimit:
        limit = self._known.get(topic)
        if limit is None:
            limit = self._known[topic] = self._of(topic)
        return limit


class ProducerFactory(Protocol):
    """Builds the producers of one process, all with the same ``message.max.bytes``."""

    @property
    def max_message_bytes(self) -> int:
        """The producers' ``message.max.bytes``: librdkafka refuses a larger record."""
        ...

    def limit(self, topic: str) -> RecordLimit:
        """The most a record for ``topic`` may have (:func:`record_limit`)."""
        ...

    def __call__(self, transactional_id: str | None = None) -> KafkaProducer:
        """A new producer; transactional when ``transactional_id`` is given."""
        ...


def record_size(key: bytes | str | None, value: bytes | None, headers: Headers) -> int:
    """The bytes of a record's key, value and headers, as librdkafka counts them against
    ``message.max.bytes`` (it adds a few dozen bytes of framing)."""

    def size(data: bytes | str | None) -> int:
        return len(data.encode("utf-8") if isinstance(data, str) else data or b"")

    return size(key) + size(value) + sum(size(name) + size(data) for name, data in headers)


def produce(
    producer: KafkaProducer,
    topic: str,
    key: bytes | str | None,
    value: bytes | None,
    headers: Headers,
    on_delivery: OnDelivery | None = None,
    partition: int | None = None,
) -> None:
    """Produce one record, retrying while librdkafka's local queue is full; to
    ``partition`` where given, else where the partitioner puts its key.

    ``BufferError`` only means the producer's queue (``queue.buffering.max.messages``)
    is full; serving delivery reports empties it, so the record is never dropped.
    Any other failure (``KafkaException``) is the caller's to classify.
    """
    while True:
        try:
            if partition is not None:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    headers=list(headers),
                    on_delivery=on_delivery,
                    partition=partition,
                )
            elif on_delivery is None:
                producer.produce(topic, value=value, key=key, headers=list(headers))
            else:
                producer.produce(
                    topic, value=value, key=key, headers=list(headers), on_delivery=on_delivery
                )
            return
        except BufferError:
            producer.poll(_DRAIN_S)
