"""The feeder's state topic: per batch, the offset below which all of it was fed.

``<requests_topic>.feeder-state`` is compacted, one partition, keyed by batch id; its
value is the batch's ``fed_to`` offset in the pending partition as decimal text, written
in the same transaction as the slice it covers, and a tombstone once no feeder will scan
that batch again (:meth:`worker.feeder.index.PendingIndex.retire`). A feeder that takes
the pending partition over reads it whole before it feeds anything.

The feeder that holds the pending partition also writes, every :data:`ALIVE_EVERY_S`,
the record :data:`ALIVE_KEY` → ``alive <unix seconds>``: ``serve`` reads it to tell a
fleet that feeds from one where no feeder runs (``scheduling.fair`` off on the workers),
which would otherwise leave a batch ``in_progress`` for ever (docs/architecture.md §10).
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

READ_TIMEOUT_S = 60.0
#: the key of the feeder's heartbeat: never a batch id (those have no NUL)
ALIVE_KEY = b"\x00feeder-alive"
ALIVE_EVERY_S = 10.0


def alive(now: float) -> bytes:
    return f"alive {now:.0f}".encode()


def alive_at(value: bytes | None) -> float | None:
    """When the heartbeat ``value`` was written; None when it is not one."""
    if value is None or not value.startswith(b"alive "):
        return None
    stamp = value.removeprefix(b"alive ")
    return float(stamp) if stamp.isdigit() else None


def encode(fed_to: int) -> bytes:
    return str(fed_to).encode()


def read_state(kafka: KafkaConfig, topic: str) -> dict[str, int]:
    """Every batch's ``fed_to``, read to the end of ``topic`` (committed records only)."""
    consumer = clients.consumer(
        kafka, f"{kafka.group_id}.feeder-state", extra={"enable.partition.eof": True}
    )
    fed_to: dict[str, int] = {}
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        consumer.assign([TopicPartition(topic, 0, FROM_START)])
        while True:
            if time.monotonic() > deadline:
                raise KafkaException(
                    KafkaError(KafkaError._TIMED_OUT, f"{topic} not read to its end")
                )
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return fed_to
                if error.fatal():
                    raise KafkaException(error)
                continue
            if msg.key() == ALIVE_KEY:
                continue
            batch_id = (msg.key() or b"").decode("utf-8", "replace")
            value = msg.value()
            if value is None:
                fed_to.pop(batch_id, None)
            elif value.isdigit():
                fed_to[batch_id] = int(value)
    finally:
        consumer.close()
