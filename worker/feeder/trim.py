"""The pending partition trimmed below what was fed (docs/architecture.md §10, issue 38).

The pending topic keeps every record (``retention.ms = -1``: an unfed record must never
be deleted by the cluster's retention), so without trimming its disk grows for ever and
every prompt stays. Everything below the feeder group's committed offset was fed (the
offset is the lowest record still to be fed), so after a step commits, the mover asks the
broker to delete the records below it (``DeleteRecords``, Kafka ≥ 0.11), at most every
:data:`TRIM_EVERY_S` and one request at a time; the request runs in librdkafka's thread
and its outcome is read at the next call, so a feed step never waits for it.

A broker that does not serve ``DeleteRecords`` — the embedded broker, Tansu 0.6, closes
the connection on it — is said once in the log and by
``batchpipe_feeder_trim_supported 0``; trimming stops for that mover and the pending
topic grows as before (docs/deploy.md "How long records stay"). Any other failure is
logged and tried again a period later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

TRIM_EVERY_S = 30.0
REQUEST_TIMEOUT_S = 30.0
#: what a broker without DeleteRecords answers (librdkafka's reading of it)
UNSUPPORTED = frozenset(
    {KafkaError._TRANSPORT, KafkaError.UNSUPPORTED_VERSION, KafkaError.INVALID_REQUEST}
)


class Admin(Protocol):
    def delete_records(
        self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
    ) -> dict[TopicPartition, Future[Any]]: ...


class Trim:
    def __init__(
        self,
        admin: Admin,
        topic: str,
        report: Callable[[bool, int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._topic = topic
        self._report = report  # (supported, the offset trimmed below)
        self._clock = clock
        self._asked: tuple[int, Future[Any]] | None = None  # the request in flight
        self._last = -TRIM_EVERY_S  # when the last request was made
        self.trimmed = 0  # every record below this offset is gone
        self.supported = True

    def committed(self, offset: int) -> None:
        """The feeder group committed ``offset``: everything below it was fed."""
        self.poll()
        now = self._clock()
        if not self.supported or self._asked is not None or offset <= self.trimmed:
            return
        if now - self._last < TRIM_EVERY_S:
            return
        self._last = now
        (future,) = self._admin.delete_records(
            [TopicPartition(self._topic, 0, offset)], request_timeout=REQUEST_TIMEOUT_S
        ).values()
        self._asked = (offset, future)

    def poll(self) -> None:
        """Read the outcome of the request in flight, if it has one."""
        if self._asked is None or not self._asked[1].done():
            return
        offset, future = self._asked
        self._asked = None
        try:
            future.result()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            if code in UNSUPPORTED:
                self.supported = False
                log.warning(
                    "feeder: the broker does not delete records (%s): %s is not trimmed "
                    "and keeps every record (docs/deploy.md)",
                    exc,
                    self._topic,
                )
                self._report(False, self.trimmed)
            else:
                log.warning("feeder: trimming %s below %d failed: %s", self._topic, offset, exc)
            return
        self.trimmed = offset
        self._report(True, offset)
