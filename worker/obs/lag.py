"""Consumer lag of the worker's assignment, measured from offsets, paused partitions included.

librdkafka's statistics report ``consumer_lag`` -1 (unknown) for a partition it has not
fetched since it was assigned — one assigned while the worker was paused, for instance —
and a sum that skips unknown partitions reads 0 with a backlog waiting. So the worker
measures lag itself, every :data:`INTERVAL_S` and as soon as its assignment changes, on a
thread of its own (:meth:`LagProbe.start`): each query is a broker round trip (on the
embedded broker, up to a second for one partition), and measured from the worker loop it
held requests back for seconds while the engine idled (issue 29). From that thread it
calls only what librdkafka answers locally (the consumer's positions) or through a client
of its own (end and committed offsets). It never calls the worker's consumer: from another
thread ``assignment()`` and ``position()`` waited for the loop's ``consume`` and stalled
for seconds (measured: 7 s), so the loop tells the probe its assignment on every rebalance
(:meth:`LagProbe.gained`, :meth:`LagProbe.released`) and where it has read to
(``read_to``); those and ``unanswered`` must be safe to call from another thread.

    lag = end offset − the consumer's position + records read but not answered yet

``end offset`` is the larger of the broker's answer to ListOffsets and the position (each
is a lower bound of the true end; ListOffsets is exact on Apache Kafka). The position is
the offset after the last record the loop read; a partition nothing was read from since
its assignment starts at its committed offset, or at its low watermark when the group has
committed none.
A partition whose end or start cannot be read is *unknown* — counted in
``batchpipe_consumer_lag_unknown_partitions``, never reported as 0.

Offsets count transaction markers too: every transaction that wrote to a partition
(``submit``'s, the feeder's) leaves a control record after its data, which no reader is
ever given, and the group's committed offset stops before it. Counted as offsets, every
idle partition read lag 1 (issue 41: ``lag 5`` in the summary with everything answered,
and KEDA scales on it). So when nothing of a partition is in the worker and its offsets
differ by at most :data:`PEEK_MAX`, the probe reads that range with its own client
(``read_committed``: markers and aborted records are never returned) and counts the
records it gets; the answer is kept until the range changes, so an idle partition is read
once. A range it cannot read within :data:`QUERY_TIMEOUT_S` counts as offsets (an upper
bound). A larger range is a backlog, and its markers (one per publishing transaction) a
small part of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from batcher import Partition
from worker.kafka.consumer import KafkaConsumer
from worker.obs.metrics import WorkerMetrics

log = logging.getLogger(__name__)

#: seconds between two measurements of an unchanged assignment
INTERVAL_S = 5.0
#: how often the probe's thread looks for a changed assignment
WATCH_S = 0.25
#: the most one broker query may block the worker loop; after one query fails, the
#: partitions left in that measurement are unknown without asking
QUERY_TIMEOUT_S = 1.0
#: the widest offset range read to tell records from transaction markers
PEEK_MAX = 64

#: records of a partition read but not answered yet (in flight or held)
Unanswered = Callable[[Partition], int]
#: per partition read from since its assignment: the offset after the last record read
ReadTo = Callable[[], Mapping[Partition, int]]


class LagProbe:
    """Measures the lag of the worker's assignment into ``metrics``.

    ``queries`` answers the broker queries (end and committed offsets): a client of its
    own, never the worker's consumer.
    """

    def __init__(
        self,
        queries: KafkaConsumer,
        metrics: WorkerMetrics,
        unanswered: Unanswered,
        read_to: ReadTo,
    ) -> None:
        self._queries = queries
        self._read_to = read_to
        self._metrics = metrics
        self._unanswered = unanswered
        self._measured: frozenset[Partition] = frozenset()
        # per partition: the offset range last read for records, and how many it held
        self._peeked: dict[Partition, tuple[int, int, int]] = {}
        self._assignment: frozenset[Partition] = frozenset()  # replaced whole, never changed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def gained(self, partitions: Iterable[Partition]) -> None:
        """Partitions assigned to the consumer (the loop calls this from its rebalances)."""
        self._assignment = self._assignment | frozenset(partitions)

    def released(self, partitions: Iterable[Partition]) -> None:
        """Partitions revoked or lost."""
        self._assignment = self._assignment - frozenset(partitions)

    def start(self) -> None:
        """Measure on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="batchpipe-lag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop measuring; returns once no query is under way (before the consumer closes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(INTERVAL_S + 2 * QUERY_TIMEOUT_S)
            self._queries.close()

    def _run(self) -> None:
        waited = INTERVAL_S  # measure at once
        while not self._stop.is_set():
            if waited >= INTERVAL_S or self._assignment != self._measured:
                try:
                    self.measure()
                except (KafkaException, RuntimeError) as exc:  # closed under it, or down
                    log.debug("lag not measured: %s", exc)
                waited = 0.0
            self._stop.wait(WATCH_S)
            waited += WATCH_S

    def measure(self) -> Mapping[Partition, int | None]:
        """Lag per assigned partition (None: unknown), published to the metrics."""
        assignment = [TopicPartition(t, p) for t, p in sorted(self._assignment)]
        read_to = self._read_to()
        positions = {at: read_to.get(at, -1) for at in _pairs(assignment)}
        unread = [tp for tp in assignment if positions[(tp.topic, tp.partition)] < 0]
        starts = self._committed(unread) if unread else {}
        lags: dict[Partition, int | None] = {}
        reachable = True
        for tp in assignment:
            at = (tp.topic, tp.partition)
            ends = self._ends(tp) if reachable else None
            reachable = ends is not None
            lags[at] = None if ends is None else self._lag(at, ends, positions[at], starts.get(at))
        self._measured = frozenset(lags)
        self._metrics.set_consumer_lag(lags)
        return lags

    def _ends(self, tp: TopicPartition) -> tuple[int, int] | None:
        """(low watermark, end offset) of ``tp``; None when the broker does not answer."""
        try:
            low, high = self._queries.get_watermark_offsets(
                tp, timeout=QUERY_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            log.debug("end offset of %s[%d] unknown: %s", tp.topic, tp.partition, exc)
            return None
        return low, high

    def _lag(
        self, at: Partition, ends: tuple[int, int], position: int, committed: int | None
    ) -> int | None:
        low, high = ends
        if position >= 0:
            start = position
        elif committed is None:
            return None  # the committed offset could not be read
        else:
            start = committed if committed >= 0 else low  # none committed: from the start
        end = max(high, position)
        if end < 0 or start < 0:
            return None
        unanswered = self._unanswered(at)
        # a librdkafka client only: the in-memory fakes write no markers, and their offsets
        # client is the loop's own consumer, which must never be assigned from here
        peek = isinstance(self._queries, Consumer)
        if peek and unanswered == 0 and 0 < end - start <= PEEK_MAX:
            return self._records(at, start, end)
        return max(0, end - start) + unanswered

    def _records(self, at: Partition, start: int, end: int) -> int:
        """Committed records in offsets ``[start, end)`` of ``at``, markers not counted;
        ``end - start`` when they cannot be read."""
        known = self._peeked.get(at)
        if known is not None and known[:2] == (start, end):
            return known[2]
        topic, partition = at
        self._queries.assign([TopicPartition(topic, partition, start)])
        count, deadline = 0, time.monotonic() + QUERY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                for record in self._queries.consume(end - start, WATCH_S):
                    offset = record.offset()
                    if record.error() is None and offset is not None and offset < end:
                        count += 1
                [at_now] = self._queries.position([TopicPartition(topic, partition)])
                if at_now.offset >= end:
                    self._peeked[at] = (start, end, count)
                    return count
        except KafkaException as exc:
            log.debug("records of %s[%d] not read: %s", topic, partition, exc)
        finally:
            self._queries.assign([])
        return end - start

    def _committed(self, partitions: list[TopicPartition]) -> dict[Partition, int]:
        """The group's committed offsets (negative: none); empty when they cannot be read."""
        try:
            found = self._queries.committed(partitions, timeout=QUERY_TIMEOUT_S)
        except KafkaException as exc:
            log.debug("committed offsets unknown: %s", exc)
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None}


def _pairs(partitions: list[TopicPartition]) -> list[Partition]:
    return [(tp.topic, tp.partition) for tp in partitions]
