"""The progress topic: which records above a partition's committed offset are answered.

Answers are published in the first transaction after they complete, ahead of slower
records of their partition, so a committed offset no longer says everything the next owner
of a partition must know. Each exactly-once transaction therefore also writes, for every
input partition it moves or answers, one :class:`batcher.Progress` record to
``<requests topic>.progress`` (the same partition number), and commits, beside the input
offsets, a *pointer*: the group's offset of that progress partition, one past the record.
The next owner reads the pointers with the committed offsets (:func:`resume`), the one
record each names, and skips what it says is answered (docs/architecture.md §2 "Answers on
completion").

Invariants:

* A pointer is committed only in the transaction that wrote the record it names, and only
  once every record of that transaction was acknowledged (the committer flushes first), so
  a pointer never names a record that covers an answer not written; a zombie's record is
  never named (its transaction is refused by generation or fenced).
* Every transaction that writes a partition's progress record also commits that
  partition's input offset, equal to the record's ``committed``; a reader inherits a record
  only where the two agree, so offsets reset or expired, a topic recreated, or a pointer
  left from another history make it skip nothing.
* A record that cannot be read or decoded, names another partition, or disagrees with the
  committed offset is no progress: the reader skips less and answers some records again —
  a repeat, never a loss.
* A takeover reads one committed-offsets answer and at most one record per partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from batcher import OffsetTracker, Partition, Progress
from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.consumer import FROM_START, KafkaConsumer
from worker.wire.progress import decode_progress, encode_progress

log = logging.getLogger(__name__)

#: how long a takeover waits for the records its pointers name
READ_TIMEOUT_S = 10.0


def progress_topic(requests_topic: str) -> str:
    return f"{requests_topic}.progress"


@dataclass(frozen=True)
class ProgressRecord:
    """One progress record of a transaction: for input partition ``origin``, whose offset
    the same transaction commits at ``committed``."""

    origin: Partition
    committed: int
    key: str
    value: bytes


def record(group: str, origin: Partition, progress: Progress) -> ProgressRecord:
    """The progress record of input partition ``origin``; keyed by group and partition, so
    that compaction keeps each group's latest record of each partition."""
    value = encode_progress(group, origin, progress)
    return ProgressRecord(origin, progress.committed, f"{group}:{origin[0]}:{origin[1]}", value)


class ProgressLog(Protocol):
    """Where progress records are read back from."""

    @property
    def topic(self) -> str: ...

    @property
    def partitions(self) -> int:
        """How many partitions the progress topic has: input partitions from this number
        on get no progress records."""
        ...

    def read(self, records: Mapping[Partition, int]) -> dict[Partition, bytes | None]:
        """The value of the record at each offset of the progress topic (keyed by the input
        partition whose record it is); a record not read within the bound is absent."""
        ...


class KafkaProgressLog:
    """The progress topic on the cluster, read with a consumer of no group."""

    def __init__(self, kafka: KafkaConfig, partitions: int) -> None:
        self._kafka = kafka
        self._topic = progress_topic(kafka.requests_topic)
        self._partitions = partitions

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partitions(self) -> int:
        return self._partitions

    def read(self, records: Mapping[Partition, int]) -> dict[Partition, bytes | None]:
        if not records:
            return {}
        # read_uncommitted: the offset is exact and its transaction committed (a pointer
        # names nothing else), so there is no last stable offset to wait behind. A record
        # gone (compacted, deleted) ends its partition's read at the next record or at the
        # partition's end, not at the deadline
        consumer = clients.consumer(
            self._kafka,
            f"{self._kafka.group_id}.progress-reader",
            read_committed=False,
            extra={"enable.partition.eof": True},
        )
        wanted = {(self._topic, origin[1]): (origin, offset) for origin, offset in records.items()}
        found: dict[Partition, bytes | None] = {}
        done: set[tuple[str, int]] = set()
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), (_, o) in wanted.items()])
            deadline = time.monotonic() + READ_TIMEOUT_S
            while len(done) < len(wanted) and time.monotonic() < deadline:
                for message in consumer.consume(len(wanted), 0.2):
                    at = (message.topic() or "", message.partition() or 0)
                    if at not in wanted or at in done:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            done.add(at)
                        continue
                    origin, offset = wanted[at]
                    if message.offset() == offset:
                        found[origin] = message.value()
                    done.add(at)  # the record, or one past where it was
        finally:
            consumer.close()
        return found


def resume(
    consumer: KafkaConsumer,
    log_: ProgressLog,
    group: str,
    tracker: OffsetTracker,
    partitions: Collection[Partition],
    timeout_s: float,
) -> list[TopicPartition]:
    """Where the group resumes each of ``partitions`` (its committed offset, or
    :data:`FROM_START`), with what earlier owners answered above it handed to ``tracker``
    (:meth:`OffsetTracker.inherit`). Raises ``KafkaException`` as
    :func:`~worker.kafka.consumer.resume_points` does."""
    inputs = [TopicPartition(t, p) for t, p in partitions]
    pointers = [TopicPartition(log_.topic, p) for _, p in partitions if p < log_.partitions]
    committed = consumer.committed(inputs + pointers, timeout_s)
    for tp in committed[: len(inputs)]:
        if tp.error is not None:
            raise KafkaException(tp.error)
    starts = {(tp.topic, tp.partition): tp.offset for tp in committed[: len(inputs)]}
    named: dict[Partition, int] = {}
    by_number = {p: (t, p) for t, p in partitions}
    for tp in committed[len(inputs) :]:
        if tp.error is None and tp.offset > 0:
            named[by_number[tp.partition]] = tp.offset - 1
    values = log_.read(named) if named else {}
    for origin in sorted(named):
        progress = decode_progress(group, origin, values.get(origin))
        if progress is None or progress.committed != starts[origin]:
            # unreadable, or written with another committed offset than the one read now
            # (offsets reset or expired, the topic recreated): skipping by it could lose
            # records, answering them again only repeats
            found = "unreadable" if progress is None else f"at offset {progress.committed}"
            log.warning(
                "%s: the progress record at %s:%d is %s, the committed offset %d; answers "
                "above the committed offset may be repeated",
                origin,
                log_.topic,
                named[origin],
                found,
                starts[origin],
            )
            continue
        if tracker.position(origin) is not None:  # never: every path forgets it first
            log.warning("%s: still tracked at its assignment; its progress is not used", origin)
            continue
        tracker.inherit(origin, progress)
    missing = sorted(p for p in partitions if p[1] >= log_.partitions)
    if missing:
        log.warning(
            "%s: no progress partition (%s has %d); answers above the committed offset may "
            "be repeated by the next owner",
            missing,
            log_.topic,
            log_.partitions,
        )
    return [
        TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else FROM_START)
        for tp in committed[: len(inputs)]
    ]
