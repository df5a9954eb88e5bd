"""Cancelled and expired batches leave fair share at once (docs/architecture.md §10).

The feeder reads the control topic as every worker does (:mod:`worker.kafka.cancellations`). A
stopped batch is removed from :class:`~batcher.tiers.Tiers`, so it takes no more
turns from the batches still running, and what is left of it is *drained*: moved in bulk,
outside any share and outside the depth limit, for the workers to answer 4005/4006 at
admission without running it (microseconds each). Every line still gets exactly one
answer, by the one path that gives answers; records of a stopped batch that the scan
reaches later are drained as well. A batch the feeder quarantines (:mod:`worker.feeder.plan`)
is stopped here at once, before its stop record is read back from the control topic.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaException, Message

from batcher.tiers import Tiers
from worker.feeder.index import PendingIndex
from worker.feeder.readahead import PartialRead, ReadAhead
from worker.kafka.cancellations import Cancellations, Stop


class Drain:
    def __init__(self, stops: Cancellations, fair: Tiers, index: PendingIndex) -> None:
        self._stops = stops
        self._fair = fair
        self._index = index
        self._draining: dict[str, None] = {}  # in the order they were stopped
        self._local: dict[str, Stop] = {}  # stopped here (quarantined), by batch id

    def stopped(self, batch_id: str) -> bool:
        """Whether ``batch_id`` was stopped (its records are then drained, not shared)."""
        if batch_id not in self._local and self._stops.stop_for(batch_id) is None:
            return False
        self._draining[batch_id] = None
        return True

    def add(self, stop: Stop) -> bool:
        """Stop a batch from here (a quarantine); False when it was stopped already."""
        if self.stopped(stop.batch_id):
            return False
        self._local[stop.batch_id] = stop
        self._fair.remove(stop.batch_id)
        self._draining[stop.batch_id] = None
        return True

    def slices(
        self,
        ahead: ReadAhead,
        budget: int,
        unreadable: Callable[[str, Exception], None],
    ) -> list[tuple[str, list[Message]]]:
        """Up to ``budget`` records of stopped batches, in the order they were stopped; a
        batch whose records cannot be read back goes to ``unreadable`` (it must leave the
        index there), never back to the caller."""
        for batch_id in self._stops.poll():
            self._fair.remove(batch_id)
            if batch_id in self._index.batches:
                self._draining[batch_id] = None
        taken: list[tuple[str, list[Message]]] = []
        for batch_id in list(self._draining):
            if budget > 0 and batch_id in self._index.batches:
                try:
                    records = ahead.take(batch_id, budget)
                except KafkaException:
                    raise
                except Exception as exc:
                    records = exc.taken if isinstance(exc, PartialRead) else []
                    unreadable(batch_id, exc)
                if records:
                    taken.append((batch_id, records))
                budget -= len(records)
            if batch_id not in self._index.batches:
                del self._draining[batch_id]
        return taken

    def close(self) -> None:
        self._stops.close()
