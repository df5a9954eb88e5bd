"""The models the fleet serves, from the workers' announcements (worker/obs/announce.py).

:func:`served_models` reads the announcements once, to the end of their topic (``submit``);
:class:`FleetModels` follows them on a thread of its own (``serve``: ``GET /v1/models`` and
the model check of ``POST /v1/batches``). Either way a model is served while one of its
workers announced it within :data:`~worker.obs.announce.ALIVE_S`. A fleet that announced
nothing (no worker yet, scaled to zero, or workers that do not announce) serves an
*unknown* set of models: nothing is refused then.

The announcements held are bounded: one already silent when read is never held (the
compacted topic keeps the last record of every worker ever killed), at most
:data:`MAX_WORKERS` workers, those fallen silent since swept first; a record beyond that
is not taken (and logged), so a flood of forged worker ids costs a bounded memory. A
refusal names at most :data:`SHOWN_MODELS` models, each cut to :data:`SHOWN_CHARS`
characters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping

from confluent_kafka import KafkaError, KafkaException

from batchpipe.collect import open_reader, records
from worker.config import KafkaConfig
from worker.errors import BatchpipeError
from worker.kafka import clients
from worker.obs.announce import MAX_NAME_CHARS, Announcement, models_topic

log = logging.getLogger("batchpipe.fleet")

#: the most workers' announcements held (a fleet of thousands of workers fits)
MAX_WORKERS = 10_000
#: the most model names one refusal shows, and the most characters of each
SHOWN_MODELS, SHOWN_CHARS = 8, 80
#: seconds between two sweeps of a full table for workers no longer alive (and between
#: two warnings of records not taken): a flood of forged ids costs no sweep per record
SWEEP_EVERY_S = 1.0
_next_sweep = 0.0


class ModelNotServedError(BatchpipeError, ValueError):
    """A batch names a model no worker of the fleet serves."""


def alive(announced: Mapping[str, Announcement], now: float) -> dict[str, list[Announcement]]:
    """Model → the announcements of its live workers."""
    served: dict[str, list[Announcement]] = {}
    for item in announced.values():
        if item.alive(now):
            served.setdefault(item.model, []).append(item)
    return served


def not_served(models: Collection[str], served: Collection[str]) -> str | None:
    """Why ``models`` (a batch's) cannot be answered by a fleet serving ``served``; None
    when they can, or when nothing is known to be served."""
    missing = sorted(set(models) - set(served) - {""})
    if not missing or not served:
        return None
    return (
        f"model {_names(missing)} is not served by this fleet; it serves "
        f"{_names(sorted(served))}: set body.model to one of them"
    )


def _names(models: list[str]) -> str:
    """``models`` for a message, bounded: a tenant's name may be 100 KB long."""
    shown = [
        repr(m) if len(m) <= SHOWN_CHARS else f"{m[:SHOWN_CHARS]!r}... ({len(m)} characters)"
        for m in models[:SHOWN_MODELS]
    ]
    more = len(models) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def apply_record(
    announced: dict[str, Announcement], key: bytes | None, value: bytes | None
) -> None:
    global _next_sweep
    if key is None or len(key) > 4 * MAX_NAME_CHARS:
        return  # nobody's, or no worker's: a worker id is a name of MAX_NAME_CHARS at most
    worker_id = key.decode(errors="replace")
    found = Announcement.decode(value)
    if found is None or not found.alive(time.time()):
        # a tombstone (that worker stopped), unreadable, or silent since: the compacted
        # topic keeps the last record of every worker ever killed, which is never held
        announced.pop(worker_id, None)
        return
    if worker_id not in announced and len(announced) >= MAX_WORKERS:
        if time.monotonic() < _next_sweep:
            return
        _next_sweep = time.monotonic() + SWEEP_EVERY_S
        now = time.time()
        for dead in [w for w, item in announced.items() if not item.alive(now)]:
            del announced[dead]
        if len(announced) >= MAX_WORKERS:
            log.warning(
                "announcements of new workers not taken (%r first): %d workers announced "
                "already, the most held",
                worker_id[:SHOWN_CHARS],
                len(announced),
            )
            return
    announced[worker_id] = found


def served_models(kafka: KafkaConfig) -> dict[str, list[Announcement]]:
    """The models served now, read once to the end of the announcements' topic."""
    announced: dict[str, Announcement] = {}
    try:
        consumer, partitions = open_reader(kafka, models_topic(kafka), None)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return {}  # no worker ever announced
        raise
    try:
        for msg in records(consumer, partitions, until_end=True, deadline=None):
            apply_record(announced, msg.key(), msg.value())
    finally:
        consumer.close()
    return alive(announced, time.time())


class FleetModels:
    """Follows the announcements on a thread until :meth:`close`."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._lock = threading.Lock()
        self._announced: dict[str, Announcement] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-fleet-models", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def served(self) -> dict[str, list[Announcement]]:
        with self._lock:
            announced = dict(self._announced)
        return alive(announced, time.time())

    def _run(self) -> None:
        topic = models_topic(self._kafka)
        try:
            clients.ensure_topics(self._kafka, [topic], partitions=1, compacted=True)
            consumer, _ = open_reader(self._kafka, topic, None)
        except Exception:
            log.exception("the fleet's models are not followed: GET /v1/models lists none")
            return
        try:
            while not self._stop.is_set():
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None:
                    continue
                with self._lock:
                    apply_record(self._announced, msg.key(), msg.value())
        finally:
            consumer.close()
