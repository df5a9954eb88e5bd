"""Whether read_committed readers are held back on the topics a worker's transactions wrote.

A partition is *held* when its last stable offset is below its high watermark: some
transaction that produced there has not been completed by the broker. On Apache Kafka
that is a transaction still open; on a broker that completes an ended transaction only
once every transaction overlapping it has ended (Tansu, docs/architecture.md §7) it can
also be an ended one, which its producer's next transaction completes — so a worker
*settles* (:mod:`worker.kafka.transactions`) until the partitions it wrote are found not
held, rather than for a fixed time.

A question (:meth:`StableCheck.ask`) is answered on a thread of its own: the loop never
waits on the broker for it, and a broker that does not answer leaves the question out
(nothing is settled by a question that failed: its answer says every topic is held).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from batcher import Partition
from worker.config import KafkaConfig
from worker.kafka import clients

log = logging.getLogger(__name__)

#: how long one question may take at the broker
ASK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    """What the broker said, asked at ``asked`` (``time.monotonic()``): the partitions
    whose read_committed end is below their end (empty: nothing held)."""

    asked: float
    held: frozenset[Partition]


class StableCheck(Protocol):
    """Invariant: an answer is about the moment it was asked or later — a transaction that
    ended before :meth:`ask` and is not in ``held`` had been completed by the broker."""

    def ask(self, topics: Collection[str]) -> None:
        """Ask about every partition of ``topics``; a no-op while a question is out."""

    def answer(self) -> Answer | None:
        """The answer to the last question, once (None while it is out, or none was asked)."""

    def wait(self, timeout_s: float) -> Answer | None:
        """The answer, waiting up to ``timeout_s`` for it."""

    def close(self) -> None:
        """Drop the question out, if any, and the thread asking (the next question
        starts another)."""


class BrokerStableCheck:
    """:class:`StableCheck` asking the broker: ListOffsets for the latest offset of each
    partition, read_committed and read_uncommitted."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._admin: AdminClient | None = None
        self._partitions: dict[str, int] = {}  # topic → partition count, asked once
        self._thread: ThreadPoolExecutor | None = None  # started by the first question
        self._out: Future[Answer] | None = None

    def ask(self, topics: Collection[str]) -> None:
        if self._out is None:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="stable-check")
            self._out = self._thread.submit(self._ask, tuple(sorted(set(topics))))

    def answer(self) -> Answer | None:
        if self._out is None or not self._out.done():
            return None
        return self.wait(0)

    def wait(self, timeout_s: float) -> Answer | None:
        out = self._out
        if out is None:
            return None
        try:
            found = out.result(timeout_s)
        except TimeoutError:
            return None
        self._out = None
        return found

    def close(self) -> None:
        self._out = None
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def _ask(self, topics: tuple[str, ...]) -> Answer:
        asked = time.monotonic()
        try:
            return Answer(asked, self._held(topics))
        except (KafkaException, ValueError) as exc:
            log.debug("could not ask which partitions are held: %s", exc)
            count = {t: self._partitions.get(t, 1) for t in topics}
            return Answer(asked, frozenset((t, p) for t in topics for p in range(count[t])))

    def _held(self, topics: tuple[str, ...]) -> frozenset[Partition]:
        if self._admin is None:
            self._admin = clients.admin(self._kafka)
        for topic in topics:
            if topic not in self._partitions:
                count = clients.partition_count(self._kafka, topic, ASK_TIMEOUT_S)
                if not count:
                    raise ValueError(f"topic {topic!r} has no partitions")
                self._partitions[topic] = count
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        wanted = {TopicPartition(t, p): latest for t in topics for p in range(self._partitions[t])}
        ends = {}
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            futures = self._admin.list_offsets(
                wanted, isolation_level=level, request_timeout=ASK_TIMEOUT_S
            )
            ends[level] = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        stable, end = ends[IsolationLevel.READ_COMMITTED], ends[IsolationLevel.READ_UNCOMMITTED]
        return frozenset(p for p in end if stable[p] < end[p])
