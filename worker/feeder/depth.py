"""How deep the feeder lets the requests topic get: the bound that makes fair share work.

A new batch waits behind at most the records already in the requests topic, so the
feeder keeps that backlog short: *depth* = what it fed (the end offsets its own deliveries
reported) minus what the worker group committed, summed over the partitions. Both are
known exactly; the broker's end offsets, which the embedded broker under-reports (§7), are
never asked for. Records other producers wrote straight into the requests topic are not
counted: they only make the real backlog longer than the bound.

The limit follows the fleet's speed: ``answered/s × depth_s`` (the work of ``depth_s``
seconds queued ahead of a newcomer, enough to keep every worker busy while the feeder
refills), never below ``min_depth`` nor above ``max_depth``.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaException, TopicPartition

from worker.config import SchedulingConfig
from worker.kafka.consumer import KafkaConsumer

#: least time between two queries of the group's committed offsets
QUERY_S = 0.02
QUERY_TIMEOUT_S = 5.0
#: weight of the newest measurement in the smoothed answer rate
SMOOTHING = 0.05  # over about a second of queries: commits come in 100 ms steps


class Depth:
    def __init__(
        self,
        offsets: KafkaConsumer,
        topic: str,
        partitions: int,
        scheduling: SchedulingConfig,
        prefetch_count: int,
    ) -> None:
        self._offsets = offsets  # a consumer of the worker group, never subscribed
        self._partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self._min = scheduling.min_depth or 2 * prefetch_count
        self._max = max(self._min, scheduling.max_depth)
        self._depth_s = scheduling.depth_s
        self._committed_now: dict[int, int] = {}
        committed = self._committed()
        self._fed_end = dict(committed)
        self._committed_now = committed
        self._answered = sum(committed.values())
        self._queried = time.monotonic()
        self._rate = 0.0
        self.depth = 0
        self.limit = self._min

    def delivered(self, partition: int, offset: int) -> None:
        """A fed record was written at ``offset`` of ``partition``."""
        if offset + 1 > self._fed_end.get(partition, 0):
            self._fed_end[partition] = offset + 1

    def fed(self, count: int) -> None:
        """``count`` records are on their way (their deliveries not reported yet)."""
        self.depth += count

    def room(self) -> int:
        """How many more records may be fed now (≤ 0: none)."""
        now = time.monotonic()
        if now - self._queried >= QUERY_S:
            self._measure(now)
        return self.limit - self.depth

    def _measure(self, now: float) -> None:
        committed = self._committed()
        answered = sum(committed.values())
        elapsed = now - self._queried
        if elapsed > 0 and answered >= self._answered:
            rate = (answered - self._answered) / elapsed
            self._rate = SMOOTHING * rate + (1 - SMOOTHING) * self._rate
        self._answered, self._queried, self._committed_now = answered, now, committed
        self.depth = sum(max(0, end - committed.get(p, 0)) for p, end in self._fed_end.items())
        self.limit = int(min(self._max, max(self._min, self._rate * self._depth_s)))

    def _committed(self) -> dict[int, int]:
        try:
            found = self._offsets.committed(self._partitions, timeout=QUERY_TIMEOUT_S)
        except KafkaException:
            return dict(self._committed_now)  # unknown for now: the last known
        # none committed yet: the group starts that partition at offset 0 (FROM_START)
        return {tp.partition: max(0, tp.offset) for tp in found if tp.error is None}
