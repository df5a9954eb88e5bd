"""The API's records on a compacted Kafka topic, and each replica's view of them.

Every file and batch record is one record on ``kafka.state_topic`` (one partition,
``cleanup.policy=compact``), keyed ``file:<id>`` or ``batch:<id>``; deleting a file writes
a tombstone. The server keeps nothing a restart or a second replica would miss: each
replica reads the topic from its beginning at start and then follows it, so its view is
the topic's. A replica's own writes are applied as soon as the broker acknowledged them;
another replica's within the time it takes to read them — and a lookup that misses first
reads up to the topic's end before it answers 404.

Versions: a batch record carries a ``version``; a reader keeps the highest it has seen,
and a writer writes version ``n + 1`` only over version ``n`` (:class:`StaleRecord`
otherwise), so a stale replica can never bring an older state back — compaction keeps the
last record written, which is then also the highest.

Certain outcomes: librdkafka gives up on a record after ``WRITE_TIMEOUT_S``
(``message.timeout.ms``) and a write waits for that verdict, so no record is delivered
after its request was answered. A failed verdict can still mean "written, but the
acknowledgement was lost"; a failed *create* is therefore retracted (a tombstone, retried
until the broker takes it), so an object the client was told failed never appears.

Kafka reachability: a probe asks the broker for the topic's end every
``PROBE_INTERVAL_S``; without an answer for ``DOWN_AFTER_S`` Kafka is unreachable, and
every write and every lookup that must ask Kafka fails at once with
:class:`KafkaUnavailable` (the routes answer 503) instead of waiting on it.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, replace
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from batchpipe.api.records import BatchRecord, FileRecord
from worker.config import KafkaConfig
from worker.errors import BatchpipeError
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

R = TypeVar("R", FileRecord, BatchRecord)

LOAD_TIMEOUT_S = 60.0
SYNC_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
_REPORT_SLACK_S = 5.0  # the verdict comes within message.timeout.ms; slack on top of it
PROBE_INTERVAL_S = 1.0
DOWN_AFTER_S = 3.0
_POLL_S = 0.1
_STRIPES = 64
#: errors that say the broker could not be reached (rather than refusing the record)
_UNREACHABLE = {KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                KafkaError._ALL_BROKERS_DOWN}  # fmt: skip


class KafkaUnavailable(BatchpipeError, ConnectionError):
    """Kafka did not answer in time; ``message`` says what that means for the request."""


class StaleRecord(BatchpipeError, RuntimeError):
    """A batch record was written from an older version than the topic's."""


@dataclass(frozen=True)
class StateClients:
    """The Kafka clients of a :class:`StateTopic` (fakes in the unit tests)."""

    producer: Producer
    consumer: Consumer  # follows the topic, on the follower's thread
    probe: Consumer  # asks for the topic's end, from any thread


def kafka_clients(kafka: KafkaConfig) -> StateClients:
    clients.ensure_topics(kafka, [kafka.state_topic], partitions=1, compacted=True)
    timeout_ms = int(WRITE_TIMEOUT_S * 1000)
    group = f"{kafka.group_id}.api-state"
    consumer = clients.consumer(
        kafka, group, read_committed=False,
        extra={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
    )  # fmt: skip
    consumer.assign([TopicPartition(kafka.state_topic, 0, FROM_START)])
    return StateClients(
        producer=clients.producer(
            kafka, extra={"message.timeout.ms": timeout_ms, "request.timeout.ms": timeout_ms}
        ),
        consumer=consumer,
        probe=clients.consumer(kafka, group, read_committed=False),
    )


class StateTopic:
    def __init__(self, kafka: KafkaConfig, state_clients: StateClients | None = None) -> None:
        self._topic = kafka.state_topic
        found = state_clients or kafka_clients(kafka)
        self._producer, self._consumer, self._probe = found.producer, found.consumer, found.probe
        self._files: dict[str, FileRecord] = {}
        self._batches: dict[str, BatchRecord] = {}
        self._lock = threading.Condition()
        self._next_offset = 0  # of the next record to read
        self._retracting: set[str] = set()  # keys whose creation failed; tombstones owed
        self._last_answer = 0.0  # time.monotonic() of the broker's last answer
        self._batch_writes = threading.Lock()  # a version check and its write, together
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._loaded = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="api-state", daemon=True)
        self._prober = threading.Thread(target=self._watch, name="api-kafka-probe", daemon=True)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Read the topic to its end (the records of every earlier run), then follow it."""
        self._thread.start()
        if not self._loaded.wait(LOAD_TIMEOUT_S):
            raise TimeoutError(f"{self._topic} not read to its end in {LOAD_TIMEOUT_S:g}s")
        self._last_answer = time.monotonic()
        self._prober.start()

    def close(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._prober):
            if thread.is_alive():
                thread.join(10)
        self._consumer.close()
        self._probe.close()
        self._producer.flush(10)

    @property
    def healthy(self) -> bool:
        """The topic was read to its end and is followed (never waits on Kafka)."""
        return self._loaded.is_set() and self._thread.is_alive()

    @property
    def reachable(self) -> bool:
        """The broker answered within the last ``DOWN_AFTER_S`` (never waits on Kafka)."""
        return self.healthy and time.monotonic() - self._last_answer < DOWN_AFTER_S

    def guard(self, object_id: str) -> threading.Lock:
        """The lock a check and the write it allows hold together, for one object (a
        file's deletion and a batch created from it): this replica's writes cannot
        interleave between them."""
        return self._stripes[zlib.crc32(object_id.encode()) % _STRIPES]

    def _follow(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(_POLL_S)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._loaded.set()
                elif error.fatal():
                    raise KafkaException(error)
                continue
            key = (msg.key() or b"").decode()
            value = msg.value()
            with self._lock:
                if key in self._retracting:
                    # a create that failed: its record may land, its tombstone follows it
                    if value is None:
                        self._retracting.discard(key)
                else:
                    self._apply(key, value)
                self._next_offset = (msg.offset() or 0) + 1
                self._lock.notify_all()

    def _watch(self) -> None:
        """Ask the broker for the topic's end, and write the tombstones owed."""
        while not self._stop.wait(PROBE_INTERVAL_S):
            try:
                self._end_offset(PROBE_INTERVAL_S * 2)
            except KafkaUnavailable:
                continue
            with self._lock:
                owed = list(self._retracting)
            for key in owed:
                self._deliver(key, None)

    # -- writes -----------------------------------------------------------------------

    def _deliver(self, key: str, value: bytes | None) -> KafkaError | None:
        """Produce one record and wait for librdkafka's verdict: None once written."""
        verdict: list[KafkaError | None] = []
        self._producer.produce(
            self._topic, key=key.encode(), value=value, on_delivery=lambda e, m: verdict.append(e)
        )
        deadline = time.monotonic() + WRITE_TIMEOUT_S + _REPORT_SLACK_S
        while not verdict and time.monotonic() < deadline:
            self._producer.poll(_POLL_S)
        if not verdict:  # librdkafka broke its own timeout: as good as "maybe written"
            return KafkaError(KafkaError._MSG_TIMED_OUT, f"no verdict on {key}")
        if verdict[0] is None:
            self._last_answer = time.monotonic()
        elif verdict[0].code() in _UNREACHABLE:
            self._last_answer = 0.0  # down until the probe hears from the broker again
        return verdict[0]

    def _write(self, key: str, value: bytes | None, *, creates: bool) -> None:
        if not self.reachable:
            raise KafkaUnavailable(
                "Kafka is unreachable; nothing was written, retry later"
                if creates
                else "Kafka is unreachable; nothing was changed, retry later"
            )
        error = self._deliver(key, value)
        if error is None:
            with self._lock:
                self._apply(key, value)
            return
        if creates:
            with self._lock:
                self._retracting.add(key)
            raise KafkaUnavailable(
                f"Kafka did not take the record ({error.str()}); nothing was created, retry later"
            )
        raise KafkaUnavailable(
            f"Kafka did not acknowledge the change ({error.str()}); it may still take "
            "effect, and retrying it is safe"
        )

    def put_file(self, record: FileRecord, *, idempotent: bool = False) -> None:
        """Write a new file's record. ``idempotent``: its id is derived (a batch's output
        file) and writing it again is harmless, so a failed write is not retracted."""
        self._write(record.key, record.encode(), creates=not idempotent)

    def delete_file(self, record: FileRecord) -> None:
        self._write(record.key, None, creates=False)

    def put_batch(self, record: BatchRecord) -> BatchRecord:
        """Write ``record`` as the next version of its batch; returns what was written.

        ``record`` is a new batch (version 0) or a change of the version this view holds:
        after reading the topic to its end, an older base is :class:`StaleRecord`.
        """
        with self._batch_writes:
            self.sync()
            with self._lock:
                current = self._batches.get(record.id)
            base = current.version if current is not None else 0
            if record.version != base:
                raise StaleRecord(
                    f"batch {record.id}: a change of version {record.version}, but the topic "
                    f"holds version {base}"
                )
            written = replace(record, version=base + 1)
            self._write(written.key, written.encode(), creates=current is None)
            return written

    def _apply(self, key: str, value: bytes | None) -> None:
        kind, _, object_id = key.partition(":")
        if kind == "file":
            if value is None:
                self._files.pop(object_id, None)
            else:
                self._files[object_id] = FileRecord.decode(value)
        elif kind == "batch":
            if value is None:  # only a retracted create writes one
                self._batches.pop(object_id, None)
                return
            record = BatchRecord.decode(value)
            current = self._batches.get(object_id)
            if current is None or record.version >= current.version:
                self._batches[object_id] = record

    # -- reads ------------------------------------------------------------------------

    def file(self, file_id: str) -> FileRecord | None:
        return self._lookup(self._files, file_id)

    def batch(self, batch_id: str) -> BatchRecord | None:
        return self._lookup(self._batches, batch_id)

    def files(self, owner: str | None = None) -> list[FileRecord]:
        """``owner``'s files (everyone's for None), newest first."""
        with self._lock:
            mine = [f for f in self._files.values() if owner is None or f.owner == owner]
        return sorted(mine, key=lambda f: (f.created_at, f.id), reverse=True)

    def batches(self, owner: str | None = None) -> list[BatchRecord]:
        """``owner``'s batches (everyone's for None), newest first."""
        with self._lock:
            found = [b for b in self._batches.values() if owner is None or b.owner == owner]
        return sorted(found, key=lambda b: (b.created_at, b.id), reverse=True)

    def _lookup(self, records: dict[str, R], object_id: str) -> R | None:
        """The record in this view; a miss reads to the topic's end first (it may be
        another replica's), and is :class:`KafkaUnavailable` when Kafka cannot tell."""
        with self._lock:
            found = records.get(object_id)
        if found is None:
            self.sync()
            with self._lock:
                found = records.get(object_id)
        return found

    def _end_offset(self, timeout_s: float) -> int:
        try:
            _, high = self._probe.get_watermark_offsets(
                TopicPartition(self._topic, 0), timeout=timeout_s, cached=False
            )
        except KafkaException as exc:
            self._last_answer = 0.0
            raise KafkaUnavailable(f"Kafka is unreachable ({exc}); retry later") from exc
        self._last_answer = time.monotonic()
        return int(high)

    def sync(self, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Wait until this view has read everything on the topic now (bounded);
        :class:`KafkaUnavailable` when the broker or the follower cannot say."""
        if not self.reachable:
            raise KafkaUnavailable("Kafka is unreachable, so this cannot be looked up; retry later")
        high = self._end_offset(timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._next_offset < high and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
            if self._next_offset < high:
                raise KafkaUnavailable(f"{self._topic} not read to its end in {timeout_s:g}s")
