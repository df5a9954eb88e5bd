"""Weighted fair share between active batches: which batch is fed next, and how much.

Virtual-time fair queueing (start-time fair queueing over whole slices): each batch has a
``finish`` tag, its served requests divided by its weight, counted from the virtual time at
which it became active. The batch with the lowest tag is served next, a slice at a time.
Over any window in which a set of batches stays active, each receives requests in
proportion to its weight, within one slice (``quantum × weight``) of its exact share.

Invariants:

* a batch that becomes active starts at the current virtual time (the lowest tag of the
  batches already active), never below it: having been idle earns it no burst that would
  starve the others, and having arrived late costs it nothing;
* :meth:`FairShare.next` never hands out more than a batch has waiting;
* cost per call is O(log n) in the active batches (a heap with lazy deletion), and what is
  kept per batch is a few numbers, so 10,000 active batches cost kilobytes.

Pure logic: no I/O and no clock (:mod:`worker.feeder` does the moving).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass


@dataclass
class _Share:
    weight: float
    waiting: int
    tag: float  # virtual finish time of what it was served so far
    version: int  # the one heap entry that is current; older ones are stale


class FairShare:
    """Active batches by id, each with a weight and a count of requests waiting."""

    def __init__(self, quantum: int) -> None:
        if quantum < 1:
            raise ValueError(f"quantum must be at least 1, got {quantum}")
        self.quantum = quantum
        self._shares: dict[str, _Share] = {}
        self._heap: list[tuple[float, int, str]] = []  # (tag, version, batch id)
        self._now = 0.0  # virtual time: the tag of the batch served last
        self._versions = itertools.count()  # unique across batches, re-added ones included

    def __len__(self) -> int:
        """How many batches have requests waiting."""
        return len(self._shares)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._shares

    def add(self, batch_id: str, count: int, weight: float = 1.0) -> None:
        """``count`` more requests of ``batch_id`` wait (the first makes it active)."""
        if count < 1:
            return
        if not weight > 0:
            raise ValueError(f"weight of {batch_id!r} must be positive, got {weight}")
        share = self._shares.get(batch_id)
        if share is None:
            share = self._shares[batch_id] = _Share(weight, 0, self._now, next(self._versions))
            self._push(batch_id, share)
        share.waiting += count

    def remove(self, batch_id: str) -> int:
        """Forget ``batch_id`` (its requests are gone); returns how many were waiting."""
        share = self._shares.pop(batch_id, None)
        return 0 if share is None else share.waiting

    def next(self, room: int) -> tuple[str, int] | None:
        """The batch to serve now and how many of its requests (at most ``room``), counted
        as served; None when nothing waits or ``room`` < 1."""
        if room < 1:
            return None
        while self._heap:
            tag, version, batch_id = self._heap[0]
            share = self._shares.get(batch_id)
            if share is None or share.version != version:
                heapq.heappop(self._heap)  # stale: removed, or re-pushed since
                continue
            count = min(room, share.waiting, max(1, round(self.quantum * share.weight)))
            self._now = max(self._now, tag)
            share.waiting -= count
            share.tag = max(share.tag, self._now) + count / share.weight
            heapq.heappop(self._heap)
            if share.waiting:
                share.version = next(self._versions)
                self._push(batch_id, share)
            else:
                del self._shares[batch_id]
            return batch_id, count
        return None

    def waiting(self, batch_id: str) -> int:
        share = self._shares.get(batch_id)
        return 0 if share is None else share.waiting

    def _push(self, batch_id: str, share: _Share) -> None:
        heapq.heappush(self._heap, (share.tag, share.version, batch_id))
