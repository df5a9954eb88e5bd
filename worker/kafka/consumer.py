"""The consumer surface the worker uses, as structural types.

confluent-kafka's ``Consumer`` and ``Message`` satisfy these Protocols as they are; the
in-memory fakes of the unit tests (``tests/unit/worker/fakes.py``) satisfy them too, so
the worker loop runs against either. Only what the worker, the publishers and
:func:`~worker.kafka.publisher.rewind` call is listed: a new call on the consumer must
be added here first, and the fakes then have to model it.

Where a partition is read from its start, it is read from :data:`FROM_START`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Literal, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

#: a record's headers as librdkafka returns them
RecordHeaders = list[tuple[str, bytes | str | None]] | dict[str, bytes | str | None]

#: The offset every reader of a whole partition starts from, and where a group member
#: starts a partition its group never committed. Not ``OFFSET_BEGINNING`` (nor
#: ``auto.offset.reset`` alone): that asks the broker for the partition's earliest offset
#: (ListOffsets), and the embedded Tansu broker answers with the batch *stored* first,
#: which concurrent producers can make a later offset than the first one: a reader from
#: "the beginning" then skips the first record for good (``bench/broker_earliest.py``
#: measures it). Offset 0 is exact there; on Apache Kafka, a partition whose first records
#: were deleted answers "out of range", which ``auto.offset.reset=earliest`` (the setting
#: of every consumer of :mod:`worker.kafka.clients`) turns into its earliest offset.
FROM_START = 0


class Record(Protocol):
    """One consumed record, or an event (``error()`` set) in its place."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> RecordHeaders | None: ...
    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, milliseconds since the epoch)``; type 0 means none."""
        ...

    def error(self) -> KafkaError | None: ...


class KafkaConsumer(Protocol):
    """A group member: rebalance callbacks run inside ``poll``/``consume``/``close``.

    The pause state of a partition is the application's: librdkafka keeps it across
    unassign and assign, so a partition paused, revoked and assigned again stays paused.
    """

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = ...,
        on_revoke: RebalanceCallback | None = ...,
        on_lost: RebalanceCallback | None = ...,
    ) -> None: ...
    def unsubscribe(self) -> None: ...
    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[Record]: ...
    def poll(self, timeout: float = ...) -> Record | None: ...
    def assign(self, partitions: list[TopicPartition]) -> None:
        """Inside ``on_assign``: the assignment, from the offsets given, instead of the
        default one (from the committed offsets, or ``auto.offset.reset``)."""
        ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def assignment(self) -> list[TopicPartition]: ...
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def committed(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset to read of each; negative until a record was read (or seeked)
        since the partition was assigned."""
        ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]:
        """``(low, high)``: asked of the broker, or as of the last fetch when ``cached``
        (negative when unknown); raises ``KafkaException`` when the broker does not answer."""
        ...

    def consumer_group_metadata(self) -> object: ...
    def close(self) -> None: ...


RebalanceCallback = Callable[[KafkaConsumer, list[TopicPartition]], None]


def resume_points(
    consumer: KafkaConsumer, partitions: Collection[tuple[str, int]], timeout_s: float
) -> list[TopicPartition]:
    """Where the group resumes each of ``partitions``: its committed offset, or
    :data:`FROM_START` where it committed none. Raises ``KafkaException`` when the
    group coordinator does not answer within ``timeout_s``, or answers an error for a
    partition (whose resume point is then unknown: guessing 0 would answer it all again)."""
    committed = consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout_s)
    for tp in committed:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return [
        TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else FROM_START)
        for tp in committed
    ]
