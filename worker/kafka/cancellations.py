"""Batches to stop: the compacted control topic (docs/architecture.md §5, codes 4005-4008).

When a batch is cancelled (``POST /v1/batches/{id}/cancel``) or its completion window
passes, the API server writes one record to ``kafka.control_topic``: key the batch id,
value a small JSON object ``{"batch_id", "reason", "at"}``. The topic is compacted, so it
holds one record per stopped batch for as long as the cluster keeps it. Every worker reads
all of it (no consumer group: every partition from the beginning) and answers a stopped
batch's requests that have not started without running them — 4005 ``batch_cancelled``,
4006 ``batch_expired``; an in-flight engine aborts the ones it runs, which are answered
the same way. The feeder writes one too, reason ``quarantined`` with a ``detail``, for a
batch it cannot schedule (4007 ``batch_quarantined`` naming the cause, §10), and the API
server one with reason ``capped`` for a batch whose spend reached its cap (4008
``batch_cap_reached``, :mod:`batchpipe.api.costcap`). A request
already on a static engine finishes and its result is kept, as OpenAI keeps a cancelled
batch's finished results.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from confluent_kafka import Consumer, Producer, TopicPartition

from worker.config import KafkaConfig
from worker.errors import ErrorCode
from worker.kafka import clients
from worker.kafka.consumer import FROM_START
from worker.kafka.seals import Seal, is_seal

Reason = Literal["cancelled", "expired", "quarantined", "capped"]

_CODES: dict[Reason, ErrorCode] = {
    "cancelled": ErrorCode.BATCH_CANCELLED,
    "expired": ErrorCode.BATCH_EXPIRED,
    "quarantined": ErrorCode.BATCH_QUARANTINED,
    "capped": ErrorCode.BATCH_CAP_REACHED,
}
_MESSAGES: dict[Reason, str] = {
    "cancelled": "batch_cancelled: the batch was cancelled before this request ran",
    "expired": "batch_expired: the batch's completion window passed before this request ran",
    "quarantined": "batch_quarantined: the feeder could not schedule this batch, so this "
    "request was not run",
    "capped": "batch_cap_reached: the batch reached its token or cost cap before this request ran",
}
#: the longest ``detail`` a stop carries (a quarantined batch's cause)
MAX_DETAIL = 300
_METADATA_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Stop:
    """One stopped batch: why, and when (unix seconds). ``detail`` is the cause of a
    quarantine (the feeder writes it: docs/architecture.md §10), empty otherwise."""

    batch_id: str
    reason: Reason
    at: float
    detail: str = ""

    @property
    def code(self) -> ErrorCode:
        return _CODES[self.reason]

    @property
    def message(self) -> str:
        detail = self.detail[:MAX_DETAIL]
        return f"{_MESSAGES[self.reason]}: {detail}" if detail else _MESSAGES[self.reason]

    def encode(self) -> bytes:
        doc: dict[str, object] = {"batch_id": self.batch_id, "reason": self.reason, "at": self.at}
        if self.detail:
            doc["detail"] = self.detail[:MAX_DETAIL]
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, value: bytes) -> Stop:
        """Raises ``ValueError`` for a value that is not a stop record."""
        try:
            doc = json.loads(value)
        except RecursionError as exc:  # [[[[…: anyone who can write the topic may send it
            raise ValueError("a control record nested too deep") from exc
        if not isinstance(doc, dict):
            raise ValueError("a control record is a JSON object")
        batch_id, reason, at = doc.get("batch_id"), doc.get("reason"), doc.get("at")
        if not isinstance(batch_id, str) or not batch_id:
            raise ValueError("a control record names its batch_id")
        if reason not in _CODES:
            raise ValueError(f"unknown control reason {reason!r}")
        if not isinstance(at, int | float) or isinstance(at, bool):
            raise ValueError("a control record carries its time 'at'")
        detail = doc.get("detail", "")
        if not isinstance(detail, str):
            raise ValueError("a control record's detail is text")
        return cls(batch_id, reason, float(at), detail[:MAX_DETAIL])


class ControlReader(Protocol):
    """The control topic's values that arrived since the last call; never blocks."""

    def read(self) -> list[bytes]: ...

    def close(self) -> None: ...


class TopicReader:
    """Every partition of the control topic from its beginning; no group, no commits."""

    def __init__(self, kafka: KafkaConfig) -> None:
        topic = kafka.control_topic
        clients.ensure_topics(kafka, [topic], partitions=1, compacted=True)
        self._consumer: Consumer = clients.consumer(
            kafka, f"{kafka.group_id}.control", read_committed=False
        )
        metadata = self._consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, FROM_START) for p in metadata.partitions])

    def read(self) -> list[bytes]:
        messages = self._consumer.consume(num_messages=500, timeout=0)
        values = [m.value() for m in messages if m.error() is None]
        return [v for v in values if v]

    def close(self) -> None:
        self._consumer.close()


class Announcer:
    """Publishes stops through one producer kept open: a new idempotent producer first
    asks the broker for its producer id, which took 0.5 s of a stop on the embedded broker
    (a capped batch's overshoot grows with every moment of it). A delivery that fails
    drops the producer; the next stop opens a new one."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def open(self) -> Producer:
        """The producer, opened now if it is not (it gets its id in the background)."""
        with self._lock:
            if self._producer is None:
                self._producer = clients.producer(self._kafka)
            return self._producer

    def announce(self, stop: Stop, timeout_s: float = 30.0) -> None:
        """Publish ``stop`` to the control topic and wait until the broker has it."""
        topic = self._kafka.control_topic
        clients.ensure_topics(self._kafka, [topic], partitions=1, compacted=True)
        producer = self.open()
        producer.produce(topic, key=stop.batch_id.encode(), value=stop.encode())
        if producer.flush(timeout_s) != 0:
            with self._lock:
                if self._producer is producer:
                    self._producer = None
            raise TimeoutError(f"control record for {stop.batch_id} not delivered in {timeout_s}s")

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(1.0)


def announce(kafka: KafkaConfig, stop: Stop, timeout_s: float = 30.0) -> None:
    """Publish ``stop`` to the control topic and wait until the broker has it."""
    Announcer(kafka).announce(stop, timeout_s)


class Cancellations:
    """The batches stopped so far, as read from a :class:`ControlReader`; the topic's
    seals (:mod:`worker.kafka.seals`) go to ``seals`` where one is given, else are skipped."""

    def __init__(self, reader: ControlReader, seals: Callable[[Seal], None] | None = None) -> None:
        self._reader = reader
        self._seals = seals
        self._stopped: dict[str, Stop] = {}

    def poll(self) -> dict[str, Stop]:
        """The batches stopped since the last poll, by batch id. Bad records are skipped:
        the topic is written by the API server only, and a record it cannot mean is no stop."""
        new: dict[str, Stop] = {}
        for value in self._reader.read():
            if is_seal(value):
                self._seal(value)
                continue
            try:
                stop = Stop.decode(value)
            except ValueError:
                continue
            if stop.batch_id not in self._stopped:
                self._stopped[stop.batch_id] = new[stop.batch_id] = stop
        return new

    def _seal(self, value: bytes) -> None:
        if self._seals is None:
            return
        try:
            seal = Seal.decode(value)
        except ValueError:
            return  # anyone who can write the topic may write this: no seal
        self._seals(seal)

    def stop_for(self, batch_id: str) -> Stop | None:
        """The stop of ``batch_id``, None while it runs (or for a request of no batch)."""
        return self._stopped.get(batch_id) if batch_id else None

    def close(self) -> None:
        self._reader.close()
