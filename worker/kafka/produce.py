"""One produce call that waits out a full local queue, for every producer in batchpipe."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, Message, Producer

Headers = Sequence[tuple[str, bytes | str | None]]
OnDelivery = Callable[[KafkaError | None, Message], None]

#: how long to serve delivery reports before retrying a produce refused for a full queue
_DRAIN_S = 0.1


def produce(
    producer: Producer,
    topic: str,
    key: bytes | str | None,
    value: bytes,
    headers: Headers,
    on_delivery: OnDelivery | None = None,
) -> None:
    """Produce one record, retrying while librdkafka's local queue is full.

    ``BufferError`` only means the producer's queue (``queue.buffering.max.messages``)
    is full; serving delivery reports empties it, so the record is never dropped.
    Any other failure (``KafkaException``) is the caller's to classify.
    """
    while True:
        try:
            if on_delivery is None:
                producer.produce(topic, value=value, key=key, headers=list(headers))
            else:
                producer.produce(
                    topic, value=value, key=key, headers=list(headers), on_delivery=on_delivery
                )
            return
        except BufferError:
            producer.poll(_DRAIN_S)
