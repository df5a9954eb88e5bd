"""What each worker serves, announced to the fleet (``GET /v1/models``, issue 41).

A worker started by ``batchpipe worker`` announces its model every :data:`EVERY_S` on the
compacted topic ``<kafka.results_topic>.models`` (one partition; the results topic is
the one every model's group shares), keyed by its worker id: the model name requests
must carry, its requests topic, its group and the endpoints it answers. Its last record,
on a clean stop, is a tombstone. Readers (``serve`` and ``submit``, :mod:`batchpipe.fleet`,
``submit``) count a worker whose announcement is younger than :data:`ALIVE_S`: a worker
killed without a tombstone drops out after that long; one dated more than
:data:`ALIVE_S` in the reader's future (a wrong clock, or a forged record) counts neither.

Anyone who can write to the topic can write anything there, so a reader takes only what
fits: a record of at most :data:`MAX_RECORD_BYTES`, names of at most :data:`MAX_NAME_CHARS`,
at most :data:`MAX_ENDPOINTS` endpoints and a finite time; anything else reads as no
announcement (:meth:`Announcement.decode`).

A thread and a producer of its own (:class:`Announcer`): nothing here runs on, or waits
for, the worker loop.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass

from confluent_kafka import KafkaException, Producer

from worker.config import Config, KafkaConfig
from worker.kafka import clients

log = logging.getLogger(__name__)

#: seconds between two announcements of one worker
EVERY_S = 10.0
#: an announcement older than this no longer counts (three missed in a row)
ALIVE_S = 3 * EVERY_S
#: the most bytes of one announcement a reader decodes (a model name is short)
MAX_RECORD_BYTES = 64 * 1024
#: the longest worker id, model, topic or group name a reader takes (OpenAI's and Hugging
#: Face's model ids are well under 100 characters; Kafka's topic names under 250)
MAX_NAME_CHARS = 256
#: the most endpoints one announcement may list (batchpipe answers three kinds)
MAX_ENDPOINTS = 16


def models_topic(kafka: KafkaConfig) -> str:
    return f"{kafka.results_topic}.models"


@dataclass(frozen=True)
class Announcement:
    worker_id: str
    model: str
    requests_topic: str
    group_id: str
    endpoints: tuple[str, ...]
    at: float  # unix seconds, the worker's clock

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> Announcement | None:
        """The announcement in ``value``; None for a tombstone or anything else."""
        if not value or len(value) > MAX_RECORD_BYTES:
            return None
        try:
            doc = json.loads(value)
            found = cls(
                worker_id=str(doc["worker_id"]),
                model=str(doc["model"]),
                requests_topic=str(doc["requests_topic"]),
                group_id=str(doc["group_id"]),
                endpoints=tuple(str(e) for e in doc["endpoints"]),
                at=float(doc["at"]),
            )
        except (ValueError, TypeError, KeyError, RecursionError):
            return None
        names = (found.worker_id, found.model, found.requests_topic, found.group_id)
        if (
            any(len(name) > MAX_NAME_CHARS for name in (*names, *found.endpoints))
            or len(found.endpoints) > MAX_ENDPOINTS
            or not math.isfinite(found.at)
        ):
            return None
        return found

    def alive(self, now: float) -> bool:
        """Announced within :data:`ALIVE_S` of ``now``, before or (a clock ahead) after."""
        return abs(now - self.at) < ALIVE_S


class Announcer:
    """Announces one worker's model until :meth:`stop` (a context manager)."""

    def __init__(self, config: Config, worker_id: str, model: str, endpoints: Collection[str]):
        self._kafka = config.kafka
        self._worker_id = worker_id
        self._model = model
        self._endpoints = tuple(sorted(endpoints))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchpipe-announce", daemon=True)

    def __enter__(self) -> Announcer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(EVERY_S)

    def _announcement(self) -> Announcement:
        k = self._kafka
        return Announcement(
            self._worker_id, self._model, k.requests_topic, k.group_id, self._endpoints, time.time()
        )

    def _send(self, producer: Producer, topic: str, key: bytes, value: bytes | None) -> None:
        try:
            producer.produce(topic, value, key)
            producer.poll(0)
        except (KafkaException, BufferError) as exc:  # the next announcement tries again
            log.debug("announcement not sent: %s", exc)

    def _run(self) -> None:
        topic = models_topic(self._kafka)
        key = self._worker_id.encode()
        try:
            clients.ensure_topics(self._kafka, [topic], partitions=1, compacted=True)
            producer = clients.producer(self._kafka)
        except Exception as exc:  # the worker serves on; only its announcement is missing
            log.warning("cannot announce model %r on %s: %s", self._model, topic, exc)
            return
        try:
            while True:
                self._send(producer, topic, key, self._announcement().encode())
                if self._stop.wait(EVERY_S):
                    break
            self._send(producer, topic, key, None)  # a clean stop: it serves no more
        finally:
            producer.flush(5)
