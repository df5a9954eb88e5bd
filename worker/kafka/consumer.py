"""The consumer surface the worker uses, as structural types.

confluent-kafka's ``Consumer`` and ``Message`` satisfy these Protocols as they are; the
in-memory fakes of the unit tests (``tests/unit/worker/fakes.py``) satisfy them too, so
the worker loop runs against either. Only what the worker, the publishers and
:func:`~worker.kafka.publisher.rewind` call is listed: a new call on the consumer must
be added here first, and the fakes then have to model it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from confluent_kafka import KafkaError, TopicPartition

#: a record's headers as librdkafka returns them
RecordHeaders = list[tuple[str, bytes | str | None]] | dict[str, bytes | str | None]


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
    def consume(self, num_messages: int = ..., timeout: float = ...) -> Sequence[Record]: ...
    def poll(self, timeout: float = ...) -> Record | None: ...
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
