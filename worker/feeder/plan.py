"""What one feed step moves, decided without Kafka: index, read-ahead, shares, quarantine.

:class:`Planner` holds the mover's pure parts — the index of the pending partition
(:mod:`worker.feeder.index`), the read-ahead (:mod:`worker.feeder.readahead`), the fair
share (:mod:`batcher.fairshare`) and the drain of stopped batches
(:mod:`worker.feeder.stops`) — and turns scanned records into the slices of one step.
The mover (:mod:`worker.feeder.mover`) writes a step in one transaction.

*Quarantine.* Nothing one record or one batch holds may stop the feeder: before issue 38
a record that raised made the feeder rejoin, meet the same record again, and crash-loop
on every worker of the fleet in turn. A batch whose scan or slice raises anything but a
Kafka error (those end the mover, which is rebuilt from Kafka) is *quarantined*: it
leaves fair share, a stop record ``quarantined`` naming the cause goes to the control
topic in the step's transaction, and its records are drained — moved in bulk outside the
shares, for the workers to answer 4007 ``batch_quarantined: <cause>`` at admission, by
the one path that answers a stopped batch (every request still gets exactly one answer).
A quarantined batch whose records cannot even be read back is abandoned: its records are
marked fed and counted (``batchpipe_feeder_abandoned_total``), and the batch ends when
its completion window passes (``serve`` answers what has no result 4006), so the feeder
never meets them again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Message

from batcher.fairshare import FairShare
from worker.cancellations import Stop
from worker.feeder.headers import Charging, headers_of, scheduled_as
from worker.feeder.index import PendingIndex
from worker.feeder.readahead import PartialRead, ReadAhead
from worker.feeder.stops import Drain

log = logging.getLogger(__name__)


@dataclass
class Step:
    """One step's moves: per batch its records in order, how many were shared (counted
    against the depth), and the quarantines to announce with it."""

    slices: list[tuple[str, list[Message]]] = field(default_factory=list)
    shared: int = 0
    stops: list[Stop] = field(default_factory=list)
    #: batches whose unreadable records were marked fed (their cursors move too)
    abandoned: dict[str, int] = field(default_factory=dict)

    @property
    def fed(self) -> list[str]:
        """Every batch whose cursor this step moves, once each."""
        return list(dict.fromkeys([*(b for b, _ in self.slices), *self.abandoned]))

    @property
    def moved(self) -> int:
        return sum(len(records) for _, records in self.slices)


class Planner:
    def __init__(
        self,
        index: PendingIndex,
        fair: FairShare,
        ahead: ReadAhead,
        drain: Drain,
        charging: Charging,
    ) -> None:
        self.index = index
        self.fair = fair
        self.ahead = ahead
        self.drain = drain
        self._charging = charging
        self._stops: list[Stop] = []  # quarantines not yet announced
        self._abandoned: dict[str, int] = {}  # not yet in a step

    def note(self, records: Sequence[Message]) -> None:
        """Index records the scan read from the pending partition, in offset order."""
        for m in records:
            to = scheduled_as(headers_of(m), m.value(), self._charging)
            try:
                offset = m.offset()
                assert offset is not None
                first = to.batch_id not in self.index.batches
                if self.index.scan(offset, to.batch_id, to.weight):
                    self.ahead.scanned(to.batch_id, m, first)
                    if not self.drain.stopped(to.batch_id):
                        weight = self.index.batches[to.batch_id].weight
                        self.fair.add(to.batch_id, 1, weight, to.key, to.tokens)
            except KafkaException:
                raise
            except Exception as exc:
                self.quarantine(to.batch_id, f"scanning offset {m.offset()}: {_cause(exc)}")

    def plan(self, room: int, budget: int) -> Step:
        """Up to ``budget`` records: stopped batches' first (outside the shares and the
        depth), then what fair share chooses within ``room``."""
        step = Step(stops=self._stops, abandoned=self._abandoned)
        self._stops, self._abandoned = [], {}
        step.slices = self.drain.slices(self.ahead, budget, self._abandon)
        room = min(room, budget - step.moved)
        cap = self.ahead.slice_cap(len(self.fair))  # a round's slices fit the read-ahead
        while room > 0 and (picked := self.fair.next(min(room, cap))) is not None:
            batch_id, count = picked
            try:
                records = self.ahead.take(batch_id, count)
            except KafkaException:
                raise
            except Exception as exc:
                self.quarantine(batch_id, f"reading its records back: {_cause(exc)}")
                records = exc.taken if isinstance(exc, PartialRead) else []
            if not records:
                continue
            step.slices.append((batch_id, records))
            room, step.shared = room - len(records), step.shared + len(records)
        step.stops.extend(self._stops)  # quarantined while planning: announced now
        step.abandoned.update(self._abandoned)
        self._stops, self._abandoned = [], {}
        return step

    def quarantine(self, batch_id: str, cause: str) -> None:
        """``batch_id`` leaves fair share and is drained; the workers answer it 4007."""
        log.error("feeder: batch %r quarantined: %s", batch_id, cause)
        stop = Stop(batch_id, "quarantined", time.time(), cause)
        self.fair.remove(batch_id)
        # the headerless kind has no id a stop can name: drained, but not announced
        if self.drain.add(stop) and batch_id:
            self._stops.append(stop)

    def _abandon(self, batch_id: str, exc: Exception) -> None:
        """A stopped batch whose records cannot be read back: skipped for good."""
        count = self.index.abandon(batch_id)
        self.ahead.forget(batch_id)
        self._abandoned[batch_id] = self._abandoned.get(batch_id, 0) + count
        log.error("feeder: %d records of batch %r abandoned: %s", count, batch_id, _cause(exc))


def _cause(exc: BaseException) -> str:
    if isinstance(exc, PartialRead):
        return str(exc)[:200]
    return f"{type(exc).__name__}: {exc}"[:200]
