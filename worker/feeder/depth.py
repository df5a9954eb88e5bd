"""How deep the feeder lets the requests topic get: sized by the fleet's demand.

A new batch waits behind at most the records already in the requests topic, so the
feeder keeps that backlog no deeper than the fleet needs: *depth* = what it fed (the end
offsets its own deliveries reported) minus what the worker group committed, summed over
the partitions. Both are known exactly; the broker's end offsets, which the embedded
broker under-reports (§7), are never asked for. Records other producers wrote straight
into the requests topic are not counted: they only make the real backlog longer.
Partitions added to the requests topic are counted within :data:`PARTITIONS_EVERY_S`.

The limit is Little's law on the fleet (docs/architecture.md §10): the fleet holds
``rate × RTprop`` records (its bandwidth-delay product: answered/s times the shortest
feed-to-answer time of a record that did not queue), and twice that keeps every worker's
prefetch full with one set waiting behind it, whatever a request takes. A record's
feed-to-answer time includes its wait in the topic, so at saturation it doubles; the
limit would follow it without end. So, as BBR does, the limit is held at 1 × the product
for three feed-to-answer times once a period: the topic drains, records fed then wait for
nothing, and RTprop is measured afresh. Before anything is measured, and as a floor, the
limit is ``min_depth``; ``max_depth`` is its ceiling.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from confluent_kafka import KafkaException, TopicPartition

from worker.config import SchedulingConfig

#: least time between two queries of the group's committed offsets
QUERY_S = 0.02
QUERY_TIMEOUT_S = 5.0
#: the rate is measured over at least this long (commits come in 100 ms steps)
RATE_SPAN_S = 1.0
#: a probe at least this often, and at least every PROBE_RTTS feed-to-answer times
PROBE_EVERY_S = 10.0
PROBE_RTTS = 6
#: a probe holds the limit at one bandwidth-delay product for this many RTprops
PROBE_LENGTH_RTTS = 3
#: how often the requests topic's partitions are counted again (they can be added)
PARTITIONS_EVERY_S = 10.0


class CommittedOffsets(Protocol):
    def committed(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...


class Depth:
    def __init__(
        self,
        offsets: CommittedOffsets,
        topic: str,
        partitions: int,
        scheduling: SchedulingConfig,
        prefetch_count: int,
        clock: Callable[[], float] = time.monotonic,
        count_partitions: Callable[[], int] | None = None,
    ) -> None:
        self._offsets = offsets  # a consumer of the worker group, never subscribed
        self._clock = clock
        self._topic = topic
        self._count_partitions = count_partitions
        self._partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self._min = scheduling.min_depth or 2 * prefetch_count
        self._max = max(self._min, scheduling.max_depth)
        self._committed_now: dict[int, int] = {}
        committed = self._committed()
        self._fed_end = dict(committed)
        self._committed_now = committed
        #: per partition: (offset, when fed) of records not committed yet, in offset order
        self._in_flight: dict[int, deque[tuple[int, float]]] = {}
        now = clock()
        self._answers: deque[tuple[float, int]] = deque([(now, sum(committed.values()))])
        self._rates: deque[tuple[float, float]] = deque()  # (when, answered/s)
        self._rtts: deque[tuple[float, float]] = deque()  # (when, least feed-to-answer s)
        self._queried = now
        self._counted = now
        self._next_probe = now
        self._probe_until = now
        self.rtprop: float | None = None
        self.rate = 0.0
        self.depth = 0
        self.limit = self._min

    @property
    def probing(self) -> bool:
        return self._clock() < self._probe_until

    def delivered(self, partition: int, offset: int) -> None:
        """A fed record was written at ``offset`` of ``partition``."""
        if offset + 1 > self._fed_end.get(partition, 0):
            self._fed_end[partition] = offset + 1
        self._in_flight.setdefault(partition, deque()).append((offset, self._clock()))

    def fed(self, count: int) -> None:
        """``count`` records are on their way (their deliveries not reported yet)."""
        self.depth += count

    def room(self) -> int:
        """How many more records may be fed now (≤ 0: none)."""
        now = self._clock()
        if now - self._queried >= QUERY_S:
            self._measure(now)
        return self.limit - self.depth

    def _measure(self, now: float) -> None:
        if self._count_partitions is not None and now - self._counted >= PARTITIONS_EVERY_S:
            self._recount(now)
        committed = self._committed()
        self._committed_now, self._queried = committed, now
        self.depth = sum(max(0, end - committed.get(p, 0)) for p, end in self._fed_end.items())
        self._note_answers(now, sum(committed.values()))
        self._note_rtts(now, committed)
        self.limit = self._limit(now)

    def _recount(self, now: float) -> None:
        """Partitions added to the requests topic count from now on: records fed there
        were counted as never committed, so the depth only grew and feeding stalled
        (issue 38). A count that cannot be read keeps the last one."""
        assert self._count_partitions is not None
        self._counted = now
        try:
            count = self._count_partitions()
        except KafkaException:
            return
        if count > len(self._partitions):
            self._partitions = [TopicPartition(self._topic, p) for p in range(count)]

    def _note_answers(self, now: float, answered: int) -> None:
        span = max(RATE_SPAN_S, 2 * (self.rtprop or 0.0))
        self._answers.append((now, answered))
        while len(self._answers) > 2 and now - self._answers[1][0] >= span:
            self._answers.popleft()
        then, before = self._answers[0]
        if now - then >= min(span, RATE_SPAN_S) and answered >= before:
            self._rates.append((now, (answered - before) / (now - then)))
        self._expire(self._rates, now)
        self.rate = max((r for _, r in self._rates), default=0.0)

    def _note_rtts(self, now: float, committed: dict[int, int]) -> None:
        least: float | None = None
        for partition, fed in self._in_flight.items():
            upto = committed.get(partition, 0)
            while fed and fed[0][0] < upto:
                _, at = fed.popleft()
                least = now - at if least is None else min(least, now - at)
        if least is not None:
            self._rtts.append((now, least))
        self._expire(self._rtts, now)
        if self._rtts:
            self.rtprop = min(t for _, t in self._rtts)

    def _expire(self, samples: deque[tuple[float, float]], now: float) -> None:
        """Keep two periods of samples: they always hold the last probe's."""
        keep = 2 * self._period() + PROBE_LENGTH_RTTS * (self.rtprop or 0.0)
        while len(samples) > 1 and now - samples[0][0] > keep:
            samples.popleft()

    def _period(self) -> float:
        return max(PROBE_EVERY_S, PROBE_RTTS * (self.rtprop or 0.0))

    def _limit(self, now: float) -> int:
        if self.rtprop is None or self.rate <= 0:
            return self._min
        if now >= self._next_probe:
            self._probe_until = now + PROBE_LENGTH_RTTS * self.rtprop
            self._next_probe = now + self._period()
        product = self.rate * self.rtprop
        wanted = product if now < self._probe_until else 2 * product
        return int(min(self._max, max(self._min, wanted)))

    def _committed(self) -> dict[int, int]:
        try:
            found: Sequence[TopicPartition] = self._offsets.committed(
                self._partitions, timeout=QUERY_TIMEOUT_S
            )
        except KafkaException:
            return dict(self._committed_now)  # unknown for now: the last known
        # none committed yet: the group starts that partition at offset 0 (FROM_START)
        return {tp.partition: max(0, tp.offset) for tp in found if tp.error is None}
