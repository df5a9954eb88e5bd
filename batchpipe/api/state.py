"""The API's records on a compacted Kafka topic, and each replica's view of them.

Every file and batch record is one record on ``kafka.state_topic`` (one partition,
``cleanup.policy=compact``), keyed ``file:<id>`` or ``batch:<id>``; deleting a file writes
a tombstone. The server keeps nothing a restart or a second replica would miss: each
replica reads the topic from its beginning at start and then follows it, so its view is
the topic's. A replica's own writes are applied as soon as the broker acknowledged them;
another replica's within the time it takes to read them — and a lookup that misses first
reads up to the topic's end before it answers 404. A batch record carries a ``version``
and an older version never replaces a newer one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from batchpipe.api.records import BatchRecord, FileRecord
from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

R = TypeVar("R", FileRecord, BatchRecord)

LOAD_TIMEOUT_S = 60.0
SYNC_TIMEOUT_S = 5.0
_POLL_S = 0.1


class StateTopic:
    def __init__(self, kafka: KafkaConfig) -> None:
        self._topic = kafka.state_topic
        clients.ensure_topics(kafka, [self._topic], partitions=1, compacted=True)
        self._producer = clients.producer(kafka)
        self._consumer = clients.consumer(
            kafka,
            f"{kafka.group_id}.api-state",
            read_committed=False,
            extra={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
        )
        self._consumer.assign([TopicPartition(self._topic, 0, FROM_START)])
        # asks for the topic's end; the follower's consumer is busy polling on its thread
        self._probe = clients.consumer(kafka, f"{kafka.group_id}.api-state", read_committed=False)
        self._files: dict[str, FileRecord] = {}
        self._batches: dict[str, BatchRecord] = {}
        self._lock = threading.Condition()
        self._next_offset = 0  # of the next record to read
        self._loaded = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="api-state", daemon=True)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Read the topic to its end (the records of every earlier run), then follow it."""
        self._thread.start()
        if not self._loaded.wait(LOAD_TIMEOUT_S):
            raise TimeoutError(f"{self._topic} not read to its end in {LOAD_TIMEOUT_S:g}s")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._consumer.close()
        self._probe.close()
        self._producer.flush(10)

    @property
    def healthy(self) -> bool:
        return self._loaded.is_set() and self._thread.is_alive()

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
            with self._lock:
                self._apply(key, msg.value())
                self._next_offset = (msg.offset() or 0) + 1
                self._lock.notify_all()

    # -- writes -----------------------------------------------------------------------

    def _write(self, key: str, value: bytes | None) -> None:
        delivered: list[Any] = []
        self._producer.produce(
            self._topic, key=key.encode(), value=value, on_delivery=lambda e, m: delivered.append(e)
        )
        self._producer.flush(30)
        if not delivered:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{key} not delivered"))
        if delivered[0] is not None:
            raise KafkaException(delivered[0])
        with self._lock:
            self._apply(key, value)

    def put_file(self, record: FileRecord) -> None:
        self._write(record.key, record.encode())

    def delete_file(self, record: FileRecord) -> None:
        self._write(record.key, None)

    def put_batch(self, record: BatchRecord) -> BatchRecord:
        """Write ``record`` as the next version of its batch; returns what was written."""
        with self._lock:
            current = self._batches.get(record.id)
        version = max(record.version, current.version if current else 0) + 1
        written = replace(record, version=version)
        self._write(written.key, written.encode())
        return written

    def _apply(self, key: str, value: bytes | None) -> None:
        kind, _, object_id = key.partition(":")
        if kind == "file":
            if value is None:
                self._files.pop(object_id, None)
            else:
                self._files[object_id] = FileRecord.decode(value)
        elif kind == "batch" and value is not None:
            record = BatchRecord.decode(value)
            current = self._batches.get(object_id)
            if current is None or record.version >= current.version:
                self._batches[object_id] = record

    # -- reads ------------------------------------------------------------------------

    def file(self, file_id: str) -> FileRecord | None:
        return self._lookup(self._files, file_id)

    def batch(self, batch_id: str) -> BatchRecord | None:
        return self._lookup(self._batches, batch_id)

    def files(self, owner: str) -> list[FileRecord]:
        """``owner``'s files, newest first."""
        with self._lock:
            mine = [f for f in self._files.values() if f.owner == owner]
        return sorted(mine, key=lambda f: (f.created_at, f.id), reverse=True)

    def batches(self, owner: str | None = None) -> list[BatchRecord]:
        """``owner``'s batches (everyone's for None), newest first."""
        with self._lock:
            found = [b for b in self._batches.values() if owner is None or b.owner == owner]
        return sorted(found, key=lambda b: (b.created_at, b.id), reverse=True)

    def _lookup(self, records: dict[str, R], object_id: str) -> R | None:
        with self._lock:
            found = records.get(object_id)
        if found is None:
            self.sync()
            with self._lock:
                found = records.get(object_id)
        return found

    def sync(self, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Wait until this view has read everything on the topic now (bounded)."""
        _, high = self._probe.get_watermark_offsets(
            TopicPartition(self._topic, 0), timeout=timeout_s, cached=False
        )
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._next_offset < high and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))
