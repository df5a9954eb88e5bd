"""Cancelled and expired batches leave fair share at once (docs/architecture.md §10).

The feeder reads the control topic as every worker does (:mod:`worker.cancellations`). A
stopped batch is removed from :class:`~batcher.fairshare.FairShare`, so it takes no more
turns from the batches still running, and what is left of it is *drained*: moved in bulk,
outside any share and outside the depth limit, for the workers to answer 4005/4006 at
admission without running it (microseconds each). Every line still gets exactly one
answer, by the one path that gives answers; records of a stopped batch that the scan
reaches later are drained as well.
"""

from __future__ import annotations

from confluent_kafka import Message

from batcher.fairshare import FairShare
from worker.cancellations import Cancellations
from worker.feeder.index import PendingIndex
from worker.feeder.readahead import ReadAhead


class Drain:
    def __init__(self, stops: Cancellations, fair: FairShare, index: PendingIndex) -> None:
        self._stops = stops
        self._fair = fair
        self._index = index
        self._draining: dict[str, None] = {}  # in the order they were stopped

    def stopped(self, batch_id: str) -> bool:
        """Whether ``batch_id`` was stopped (its records are then drained, not shared)."""
        if self._stops.stop_for(batch_id) is None:
            return False
        self._draining[batch_id] = None
        return True

    def slices(self, ahead: ReadAhead, budget: int) -> list[tuple[str, list[Message]]]:
        """Up to ``budget`` records of stopped batches, in the order they were stopped."""
        for batch_id in self._stops.poll():
            self._fair.remove(batch_id)
            if batch_id in self._index.batches:
                self._draining[batch_id] = None
        taken: list[tuple[str, list[Message]]] = []
        for batch_id in list(self._draining):
            if budget > 0 and batch_id in self._index.batches:
                records = ahead.take(batch_id, budget)
                taken.append((batch_id, records))
                budget -= len(records)
            if batch_id not in self._index.batches:
                del self._draining[batch_id]
        return taken

    def close(self) -> None:
        self._stops.close()
