"""Weighted fair share: keys first, then a key's batches, charged in estimated tokens.

Two-level virtual-time fair queueing (start-time fair queueing over whole slices). Each
active *key* has a ``tag``: the tokens it was served divided by its weight, counted from
the virtual time at which it became active; within a key, each batch has one likewise.
The key with the lowest tag is served, and within it the batch with the lowest tag, a
slice at a time; a slice is charged its requests × the batch's estimated tokens a request.
Over any window in which a set of keys stays active, each receives tokens in proportion to
its weight, within one slice of its exact share — however many batches it splits its work
into.

Invariants:

* a key or batch that becomes active starts at the current virtual time (its level's
  lowest tag), never below it: having been idle earns it no burst that would starve the
  others, and having arrived late costs it nothing;
* a key weighs what its heaviest active batch weighs (a batch may lower its own weight,
  never raise its key's: the publisher caps it at the key's);
* the weight floor: a slice is ``quantum × weight ÷ the smallest active weight``
  requests, so the lightest batch gets ``quantum`` a turn whatever the weights' scale,
  and never more than :data:`MAX_SLICE_RATIO` × ``quantum`` (a heavier batch gets more
  turns instead: its tag grows more slowly);
* every number is bounded: a weight is clamped to [:data:`MIN_WEIGHT`,
  :data:`MAX_WEIGHT`] and a request's tokens to [1, :data:`MAX_TOKENS`], so a tag grows
  by at most ``MAX_SLICE_RATIO × quantum × MAX_TOKENS ÷ MIN_WEIGHT`` a turn and never
  becomes infinite (a weight of 1e-305 made it ``inf``, and 1e-308 overflowed the slice
  size: issue 38); tags are rebased to the virtual time when it passes :data:`REBASE_AT`,
  so increments stay far above a float's resolution;
* :meth:`FairShare.next` never hands out more than a batch has waiting;
* *newcomers first*: a batch never served yet may be handed up to ``fresh`` more than
  ``room`` (its first slice is fed even when the workers' credit is spent), its first
  slice at most ``first`` requests (:meth:`FairShare.first_slice`: one engine batch
  shared by the batches never served, so several that arrive together all reach a
  worker's next engine batch, not one slice after another), and every
  slice comes with :attr:`FairShare.tag`, its key's virtual service since the key became
  active (0 for a newcomer's first slice), and :attr:`FairShare.tag_step`, what each of
  its requests adds: the feeder writes each request's own on it and the workers start
  what they hold lowest tag first (docs/architecture.md §10);
* :meth:`FairShare.serve` hands one batch a slice out of turn (its deadline is at risk),
  charged to it and its key as their own turn, the virtual time unmoved: it is paid for
  by waiting afterwards;
* cost per call is O(log n) in the active keys and batches (heaps with lazy deletion),
  and what is kept per batch is a few numbers, so 10,000 active batches cost kilobytes.

Pure logic: no I/O and no clock (:mod:`worker.feeder` does the moving).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass, field

#: the bounds of a batch's weight: a ratio of at most a million between two batches
MIN_WEIGHT = 1e-3
MAX_WEIGHT = 1e3
#: the most tokens one request is charged (far above any model's context)
MAX_TOKENS = 1 << 24
#: a slice is at most this many quanta, whatever the ratio of two weights
MAX_SLICE_RATIO = 64
#: tags are rebased (the virtual time subtracted) once it passes this
REBASE_AT = 1e12


def clamp_weight(weight: float) -> float:
    """``weight`` within [MIN_WEIGHT, MAX_WEIGHT]; ``ValueError`` for NaN."""
    if math.isnan(weight):
        raise ValueError("a weight must be a number, got nan")
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight))


@dataclass
class _Tagged:
    weight: float
    tag: float  # virtual finish time of what it was served so far
    version: int  # the one heap entry that is current; older ones are stale


@dataclass
class _Batch(_Tagged):
    key: str = ""
    served: bool = False  # handed a slice yet: only a batch never served may overdraw
    # (and its first slice may be capped: FairShare.first_slice)
    waiting: int = 0
    tokens: float = 1.0  # estimated tokens a request: the mean of those added
    added: int = 0


@dataclass
class _Key(_Tagged):
    now: float = 0.0  # virtual time among its batches: the tag of the one served last
    since: float = 0.0  # the fleet's virtual time when it became active
    batches: dict[str, _Batch] = field(default_factory=dict)
    heap: list[tuple[float, int, str]] = field(default_factory=list)


class FairShare:
    """Active batches by id, each with a key, a weight and a count of requests waiting."""

    def __init__(self, quantum: int) -> None:
        if quantum < 1:
            raise ValueError(f"quantum must be at least 1, got {quantum}")
        self.quantum = quantum
        self._batches: dict[str, _Batch] = {}
        self._keys: dict[str, _Key] = {}
        self._heap: list[tuple[float, int, str]] = []  # (tag, version, key)
        self._now = 0.0  # virtual time among keys: the tag of the key served last
        self._versions = itertools.count()  # unique, re-added keys and batches included
        self._weights: Counter[float] = Counter()  # active batches' weights
        #: the last slice's key's virtual service since it became active, at the slice's
        #: start (0 for a newly active key), and what each of its requests adds to it: the
        #: i-th request's tag is ``tag + i × tag_step``, what the workers order held
        #: requests by (slices of equal tags then interleave request by request)
        self.tag = 0.0
        self.tag_step = 0.0
        self._new = 0  # active batches never served

    def __len__(self) -> int:
        """How many batches have requests waiting."""
        return len(self._batches)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._batches

    def add(
        self, batch_id: str, count: int, weight: float = 1.0, key: str = "", tokens: float = 1.0
    ) -> None:
        """``count`` more requests of ``batch_id`` wait (the first makes it active), each
        of about ``tokens`` estimated tokens; a batch keeps the key and weight it was first
        added with."""
        if count < 1:
            return
        weight = clamp_weight(weight)
        tokens = 1.0 if math.isnan(tokens) else min(float(MAX_TOKENS), max(1.0, tokens))
        batch = self._batches.get(batch_id)
        if batch is None:
            owner = self._keys.get(key)
            if owner is None:
                owner = self._keys[key] = _Key(weight, self._now, next(self._versions))
                owner.since = self._now
                self._push_key(key, owner)
            batch = _Batch(weight, owner.now, next(self._versions), key)
            self._new += 1
            self._batches[batch_id] = batch
            owner.batches[batch_id] = batch
            owner.weight = max(owner.weight, weight)
            self._weights[weight] += 1
            _push(owner.heap, batch_id, batch)
        batch.waiting += count
        batch.added += count
        batch.tokens += (tokens - batch.tokens) * count / batch.added

    def remove(self, batch_id: str) -> int:
        """Forget ``batch_id`` (its requests are gone); returns how many were waiting."""
        batch = self._batches.get(batch_id)
        if batch is None:
            return 0
        self._drop(batch_id, batch)
        return batch.waiting

    @property
    def newcomers(self) -> int:
        """How many active batches were never served."""
        return self._new

    def first_slice(self, engine: int) -> int:
        """The most requests a batch never served gets in its first slice: one engine
        batch (``engine`` requests) shared by every batch never served. Several batches
        arriving together are then fed a few requests each, and a worker reads them all
        before its next engine batch; with whole slices (``quantum``, 64) one after the
        other, four batches submitted together at 1 s a decoding step got their first
        answers 8 s apart (``bench.fairness``), as a worker reads its partition in
        order. The rest follows in the batch's next turns."""
        return max(1, engine // max(1, self._new))

    def next(self, room: int, fresh: int = 0, first: int | None = None) -> tuple[str, int] | None:
        """The batch to serve now and how many of its requests (at most ``room``, or
        ``room + fresh`` for a batch never served yet, and then at most ``first``),
        counted as served; None when nothing waits or the batch to serve has no room.
        :attr:`tag` is then the slice's."""
        if room < 1 and fresh < 1:
            return None
        while self._heap:
            tag, version, key = self._heap[0]
            owner = self._keys.get(key)
            if owner is None or owner.version != version:
                heapq.heappop(self._heap)  # stale: gone, or re-pushed since
                continue
            batch_id, batch = self._first(owner)
            allowed = room if batch.served else room + max(0, fresh)
            if not batch.served and first is not None:
                allowed = min(allowed, max(1, first))
            if allowed < 1:
                return None
            self._now = max(self._now, tag)
            owner.now = max(owner.now, batch.tag)
            return batch_id, self._charge(key, owner, batch_id, batch, allowed)
        return None

    def serve(self, batch_id: str, room: int) -> int:
        """Serve up to ``room`` requests of ``batch_id`` now, out of turn (its deadline is
        at risk), charged to it and its key as a turn of theirs would be — they wait the
        longer afterwards; returns how many (0: not active). :attr:`tag` is the slice's.
        The virtual time does not move: the others keep their place."""
        batch = self._batches.get(batch_id)
        if batch is None or room < 1:
            return 0
        return self._charge(batch.key, self._keys[batch.key], batch_id, batch, room)

    def _charge(self, key: str, owner: _Key, batch_id: str, batch: _Batch, room: int) -> int:
        """Hand ``batch`` a slice of at most ``room``: charge it and its key, re-queue both
        (their old heap entries go stale), and return the slice's size."""
        ratio = min(float(MAX_SLICE_RATIO), batch.weight / min(self._weights))
        count = min(room, batch.waiting, max(1, round(self.quantum * ratio)))
        cost = count * batch.tokens
        if not batch.served:
            self._new -= 1
        batch.served = True
        self.tag = max(owner.tag, self._now) - owner.since
        self.tag_step = batch.tokens / owner.weight
        batch.tag = max(batch.tag, owner.now) + cost / batch.weight
        owner.tag = max(owner.tag, self._now) + cost / owner.weight
        batch.waiting -= count
        if batch.waiting:
            batch.version = next(self._versions)
            _push(owner.heap, batch_id, batch)
        else:
            self._drop(batch_id, batch)
        if key in self._keys:
            owner.version = next(self._versions)
            self._push_key(key, owner)
        if max(self._now, owner.now) > REBASE_AT:
            self._rebase()
        return count

    def waiting(self, batch_id: str) -> int:
        batch = self._batches.get(batch_id)
        return 0 if batch is None else batch.waiting

    def _first(self, owner: _Key) -> tuple[str, _Batch]:
        """The batch of ``owner`` with the lowest tag (stale heap entries dropped)."""
        while True:
            _, version, batch_id = owner.heap[0]
            batch = owner.batches.get(batch_id)
            if batch is not None and batch.version == version:
                return batch_id, batch
            heapq.heappop(owner.heap)

    def _drop(self, batch_id: str, batch: _Batch) -> None:
        del self._batches[batch_id]
        if not batch.served:
            self._new -= 1
        self._weights[batch.weight] -= 1
        if not self._weights[batch.weight]:
            del self._weights[batch.weight]
        owner = self._keys[batch.key]
        del owner.batches[batch_id]
        if not owner.batches:
            del self._keys[batch.key]  # its heap entry is stale from now on
        elif batch.weight == owner.weight:
            owner.weight = max(b.weight for b in owner.batches.values())

    def _rebase(self) -> None:
        """Subtract each level's virtual time from its tags (keys: the fleet's; a key's
        batches: the key's own), keeping their order; O(n) once in a great while, so tags
        stay small enough that a slice's charge is never lost to rounding."""
        base = self._now
        self._now = 0.0
        self._heap = []
        for key, owner in self._keys.items():
            owner.tag -= base
            owner.since -= base
            owner.heap = []
            for batch_id, batch in owner.batches.items():
                batch.tag -= owner.now
                _push(owner.heap, batch_id, batch)
            owner.now = 0.0
            self._push_key(key, owner)

    def _push_key(self, key: str, owner: _Key) -> None:
        heapq.heappush(self._heap, (owner.tag, owner.version, key))


def _push(heap: list[tuple[float, int, str]], batch_id: str, batch: _Batch) -> None:
    heapq.heappush(heap, (batch.tag, batch.version, batch_id))
