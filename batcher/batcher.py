"""The dynamic batcher: requests wait in a queue until a batch is full or timed out.

Pure logic with no clock of its own: every call that depends on time takes ``now`` (float
seconds on the caller's clock, the same clock as :attr:`Pending.arrival`).

Life of a request: ``add`` → *queued* (or *follower* of an identical queued/running leader)
→ ``next_batch`` (a static batch) or ``take`` (room in an in-flight engine) → *running* →
``complete`` (answered, with its followers). A queued item may instead leave through
``pop_expired`` (deadline passed), and any item through ``drop_partitions`` (partition
revoked) or ``drop_where`` (its batch stopped); a running item may go back to the queue
through ``requeue``. Every added key leaves exactly once — through ``complete``,
``pop_expired``, ``drop_partitions`` or ``drop_where`` — so
every request gets exactly one answer. A request too big for any batch is the caller's to
answer before ``add`` (the worker's intake answers 4003).

A batch is released when it is *full* (the queue holds ``max_batch_size`` requests, or more
tokens than ``max_batch_tokens``: the next candidate would not fit), when the oldest queued
request has waited ``timeout_s``, or on ``flush``.

Priority with aging. A request's *effective priority* at ``now`` is its priority plus one
level per ``s = priority_aging_s`` waited: ``p + (now − arrival) / s``. A batch's first item,
its anchor, is the queued request of the highest effective priority (ties: the higher
priority, then the older). Between two requests ``now`` cancels out, so this is the order of
the *virtual arrival* ``arrival − p·s`` — a request of priority ``p`` is queued as if it had
arrived ``p·s`` earlier — which does not change as time passes: the queue stays one sorted
list, kept by insertion, and aging costs nothing per batch. Within a priority it is FIFO.

Newcomers first. A request may carry the feeder's virtual tag (:attr:`Pending.tag`: its
key's virtual service since the key became active, so a newly active key's requests carry
the lowest). A tagged request is queued just ahead of the first queued request with a
higher tag, but never more than ``s`` ahead of its own place: its virtual arrival is at
least ``arrival − p·s − s``, as if one priority level higher at most. The place is fixed
when it is queued, so the queue stays sorted by insertion; a request without a tag keeps
its place (and may be overtaken by tagged ones, within that bound). A tag therefore never
starves anything: a tenant who writes ``0`` on every request (anyone can write the requests
topic) gains at most what one priority level gains.

The bound. Let a request R of priority ``p`` be queued at ``a``; let ``P`` be the highest
priority of any request queued or arriving while R waits, ``N`` the most requests in flight
meanwhile (the worker's ``prefetch_count`` bounds it), and ``c`` the longest interval
between two calls of :meth:`next_batch` while R waits (the engine's time per batch, for a
caller that asks for a batch whenever the engine is free). A request arriving after
``a + (P − p + 1)·s`` is queued behind R (``+ 1``: a tag moves a request at most ``s``
ahead), so from ``T = a + max((P − p + 1)·s, timeout_s)`` on at most ``N − 1`` requests are
ahead of R and none joins them; every call at or after ``T`` releases a batch (R is timed
out), and every batch takes the first request in the order. R is in one of the first ``N``
batches released from ``T``::

    wait(R) <= max((P − p + 1)·s, timeout_s) + N·c

(plus one batch for each :meth:`requeue` of a request ahead of R, e.g. an engine retry).
Fed to an in-flight engine through :meth:`take`, ``c`` is the longest interval between two
calls that find room for the first queued request: a request's wait is bounded by the
engine's progress in freeing room, the way it is bounded by the batch time here.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Collection, Sequence
from typing import Generic

from batcher.dedup import DedupIndex
from batcher.formation import select
from batcher.tiers import FLEX_TAG
from batcher.types import Batch, BatchLimits, Partition, Pending, Reason, T

# Queue order: virtual arrival (arrival − priority·priority_aging_s, or a little earlier
# for a tag), then tag (none: inf), priority descending, arrival, admission sequence (a
# total order). See the module docstring.
_Entry = tuple[float, float, int, float, int, str]


#: formation chooses among at least this many of the most due queued requests ...
FORMATION_WINDOW = 256
#: ... and at least this many batches' worth
FORMATION_WINDOW_BATCHES = 8


class DynamicBatcher(Generic[T]):
    def __init__(self, limits: BatchLimits, dedup: bool = True) -> None:
        self.limits = limits
        self.dedup = dedup
        self._max_batch_size = limits.max_batch_size
        self._aging_s = limits.priority_aging_s
        self._order: list[_Entry] = []
        self._queued: dict[str, Pending[T]] = {}
        self._running: dict[str, Pending[T]] = {}
        self._index: DedupIndex[T] = DedupIndex()
        # Admission sequence of every in-flight key (followers too); kept through requeue so
        # an item goes back to its original place, and used to invalidate heap entries.
        self._seq: dict[str, int] = {}
        self._counter = itertools.count()
        # Min-heap of (arrival, seq, key) over queued items, with lazy deletion.
        self._arrivals: list[tuple[float, int, str]] = []
        self._queued_tokens = 0
        self._with_deadline = 0
        # each queued or running item's place, fixed when first queued (a tag's depends on
        # the queue then), kept through requeue
        self._entries: dict[str, _Entry] = {}
        # at least every queued tag (the highest since the queue was last empty): a tag at
        # or above it goes to its own place without a look at the queue
        self._tag_ceiling = -math.inf
        self._flex_queued = 0  # queued flex-tier items: take(flex=False) passes them by

    @property
    def max_batch_size(self) -> int:
        """The effective batch size, set by the adaptive controller within the limit."""
        return self._max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, size: int) -> None:
        if not 1 <= size <= self.limits.max_batch_size:
            raise ValueError(f"max_batch_size must be in [1, {self.limits.max_batch_size}]")
        self._max_batch_size = size

    def __len__(self) -> int:
        """Queued items (not running, followers excluded)."""
        return len(self._order)

    @property
    def flex_queued(self) -> int:
        """Queued flex-tier items (their tag at or above :data:`~batcher.tiers.FLEX_TAG`)."""
        return self._flex_queued

    def in_flight(self) -> int:
        """Every item added and not yet completed, dropped or expired, followers included."""
        return len(self._seq)

    def queued(self) -> list[Pending[T]]:
        """Queued items in formation order (the first is the next batch's anchor)."""
        return [self._queued[entry[-1]] for entry in self._order]

    def running(self) -> list[Pending[T]]:
        return list(self._running.values())

    def add(self, item: Pending[T], now: float) -> bool:
        """Queue ``item``; True if it joined an identical request as a follower instead.

        The caller admits only items within ``max_batch_tokens`` (no batch could hold a
        bigger one); a bigger item is a bug in the caller and raises ``ValueError``, not
        kept. An item already past its deadline never joins or leads a dedup group: it
        waits for ``pop_expired`` on its own.
        """
        if item.tokens > self.limits.max_batch_tokens:
            raise ValueError(
                f"request {item.key!r} needs {item.tokens} tokens (prompt + max_tokens), "
                f"over max_batch_tokens={self.limits.max_batch_tokens}"
            )
        if item.key in self._seq:
            raise ValueError(f"key {item.key!r} is already in flight")
        self._seq[item.key] = next(self._counter)
        if item.deadline is not None:
            self._with_deadline += 1
        if self.dedup and item.dedup_key is not None and not item.expired(now):
            leader = self._index.leader_for(item.dedup_key)
            if leader is not None:
                self._index.follow(leader, item)
                return True
            self._index.register(item)
        self._enqueue(item)
        return False

    def wake_at(self) -> float | None:
        """When the oldest queued item times out (None if the queue is empty)."""
        oldest = self._oldest_arrival()
        return None if oldest is None else oldest + self.limits.timeout_s

    def next_batch(self, now: float, flush: bool = False) -> Batch[T] | None:
        """Release a batch if one is due (or ``flush`` and anything is queued)."""
        return self.take(now, self._max_batch_size, self.limits.max_batch_tokens, flush=flush)

    def take(
        self, now: float, sequences: int, tokens: int, flush: bool = False, flex: bool = True
    ) -> Batch[T] | None:
        """The next requests for an engine with room for ``sequences`` more requests and
        ``tokens`` more tokens (prompt + ``max_tokens`` each), if they are due.

        ``flex=False``: the engine takes no flex-tier request now (its tag at or above
        :data:`~batcher.tiers.FLEX_TAG`, :attr:`Capacity.flex`): the same rules apply to
        the other queued requests alone, and the flex ones keep their places.

        :meth:`next_batch` is ``take`` with a whole batch's room; an in-flight engine's
        feeder passes the room left beside what already runs. The same rules apply to the
        smaller room: the requests go when they fill it (as many as ``sequences``, or more
        tokens than ``tokens``), when the oldest has waited ``timeout_s``, or on ``flush``;
        they are chosen by the same formation, the anchor first. Nothing goes while the
        anchor does not fit in ``tokens``: it waits for room rather than let smaller
        requests overtake it for ever (``tokens`` of an idle engine is at least
        ``max_batch_tokens``, which every queued request fits, so it never waits for ever).
        """
        if not self._order or sequences < 1:
            return None
        order, queued_tokens, wake = self._order, self._queued_tokens, self.wake_at()
        if not flex and self._flex_queued:
            order = [entry for entry in order if not _is_flex(entry[1])]
            if not order:
                return None
            queued_tokens = sum(self._queued[entry[-1]].tokens for entry in order)
            wake = min(entry[3] for entry in order) + self.limits.timeout_s
        full = len(order) >= sequences or queued_tokens > tokens
        reason: Reason
        if full:
            reason = "full"
        elif wake is not None and now >= wake:
            reason = "timeout"
        elif flush:
            reason = "flush"
        else:
            return None
        # formation ranks a window of the queue, not all of it: the most due requests, many
        # batches' worth, so a deep queue (prefetch_count in the thousands) costs each
        # request what a shallow one does (issue 48: prefetch 4096 spent 0.7 s of 7.5 in
        # ranking 4,000 queued requests for each of 188 batches)
        window = max(FORMATION_WINDOW, FORMATION_WINDOW_BATCHES * sequences)
        queue = [self._queued[entry[-1]] for entry in order[:window]]
        if queue[0].tokens > tokens:
            return None
        items = select(
            queue,
            sequences,
            tokens,
            length_aware=self.limits.length_aware,
            shared_prefix=self.limits.shared_prefix,
            now=now,
            aging_s=self._aging_s,
        )
        for item in items:
            self._dequeue(item)
            self._running[item.key] = item
        return Batch(items=tuple(items), reason=reason, formed_at=now)

    def complete(self, key: str) -> list[Pending[T]]:
        """A running leader finished: ``[leader, *followers]``, all removed.

        Returns ``[]`` for a key that is no longer in flight (dropped by a revoke while it
        ran): nobody is left to answer.
        """
        if key in self._queued or self._index.is_follower(key):
            raise ValueError(f"key {key!r} is not running")
        leader = self._running.pop(key, None)
        if leader is None:
            return []
        answered = [leader, *self._index.retire(key)]
        for item in answered:
            self._forget(item)
        return answered

    def requeue(self, items: Sequence[Pending[T]]) -> None:
        """Put running items back in the queue at their original place (arrival kept), e.g.
        to split and retry after an engine failure. Items no longer running are ignored."""
        for item in items:
            running = self._running.pop(item.key, None)
            if running is not None:
                self._enqueue(running)

    def pop_expired(self, now: float) -> list[Pending[T]]:
        """Remove and return queued items (and followers of queued leaders) whose deadline
        passed. Running items and their followers are not expired: their result is coming.
        A follower still in time is promoted when its leader expires."""
        if not self._with_deadline:
            return []
        expired: list[Pending[T]] = []
        for leader in self.queued():
            if leader.expired(now):
                self._dequeue(leader)
                expired.append(leader)
                expired.extend(self._hand_over(leader, keep=lambda f: not f.expired(now)))
        for leader_key, follower in self._index.all_followers():
            if leader_key in self._queued and follower.expired(now):
                self._index.remove_follower(follower.key)
                expired.append(follower)
        for item in expired:
            self._forget(item)
        return expired

    def drop_partitions(self, partitions: Collection[Partition]) -> list[Pending[T]]:
        """Remove and return every queued, running and follower item of ``partitions``.

        A dropped leader's followers from other partitions are not lost: the first becomes
        the leader, back in the queue, and the others follow it.
        """
        revoked = set(partitions)
        return self.drop_where(lambda item: item.partition in revoked, running=True)

    def drop_where(
        self, doomed: Callable[[Pending[T]], bool], *, running: bool = False
    ) -> list[Pending[T]]:
        """Remove and return every queued item and every follower for which ``doomed`` holds,
        and the running ones too when ``running``.

        Without ``running``, running items stay: they are on the engine and answer when
        they finish (a static engine cannot stop part of a batch). With it, the caller
        takes them off the engine (an in-flight engine aborts them). A dropped leader's
        other followers are not lost: the first becomes the leader, back in the queue.
        """
        dropped: list[Pending[T]] = []
        leaders = [*self.queued(), *(self._running.values() if running else ())]
        for leader in leaders:
            if doomed(leader):
                if leader.key in self._queued:
                    self._dequeue(leader)
                else:
                    del self._running[leader.key]
                dropped.append(leader)
                dropped.extend(self._hand_over(leader, keep=lambda f: not doomed(f)))
        for _, follower in self._index.all_followers():
            if doomed(follower):
                self._index.remove_follower(follower.key)
                dropped.append(follower)
        for item in dropped:
            self._forget(item)
        return dropped

    def _hand_over(
        self, leader: Pending[T], keep: Callable[[Pending[T]], bool]
    ) -> list[Pending[T]]:
        """``leader`` left without a result: promote its first kept follower to lead the
        other kept ones; return the followers that are not kept."""
        followers = self._index.retire(leader.key)
        kept = [f for f in followers if keep(f)]
        if kept:
            new_leader, *rest = kept
            self._index.register(new_leader)
            for follower in rest:
                self._index.follow(new_leader.key, follower)
            self._enqueue(new_leader)
        return [f for f in followers if not keep(f)]

    def _entry(self, item: Pending[T]) -> _Entry:
        virtual_arrival = item.arrival - item.priority * self._aging_s
        tag = math.inf if item.tag is None else item.tag
        if tag < self._tag_ceiling:  # newcomers first, at most aging_s ahead (module doc)
            for entry in self._order:
                if entry[1] > tag:
                    floor = virtual_arrival - self._aging_s
                    virtual_arrival = max(floor, min(virtual_arrival, entry[0]))
                    break
        return (
            virtual_arrival,
            tag,
            -item.priority,
            item.arrival,
            self._seq[item.key],
            item.key,
        )

    def _enqueue(self, item: Pending[T]) -> None:
        entry = self._entries.get(item.key)
        if entry is None:
            entry = self._entries[item.key] = self._entry(item)
        bisect.insort(self._order, entry)
        self._tag_ceiling = max(self._tag_ceiling, entry[1])
        self._queued[item.key] = item
        self._queued_tokens += item.tokens
        self._flex_queued += _is_flex(entry[1])
        heapq.heappush(self._arrivals, (item.arrival, self._seq[item.key], item.key))
        # Stale heap entries are dropped lazily; compact when they dominate.
        if len(self._arrivals) > 2 * len(self._order) + 64:
            self._arrivals = [(e[3], e[4], e[5]) for e in self._order]
            heapq.heapify(self._arrivals)

    def _dequeue(self, item: Pending[T]) -> None:
        entry = self._entries[item.key]
        del self._order[bisect.bisect_left(self._order, entry)]
        del self._queued[item.key]
        self._queued_tokens -= item.tokens
        self._flex_queued -= _is_flex(entry[1])
        if not self._order:
            self._tag_ceiling = -math.inf

    def _oldest_arrival(self) -> float | None:
        heap = self._arrivals
        while heap and not (heap[0][2] in self._queued and self._seq[heap[0][2]] == heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _forget(self, item: Pending[T]) -> None:
        del self._seq[item.key]
        self._entries.pop(item.key, None)
        if item.deadline is not None:
            self._with_deadline -= 1


def _is_flex(tag: float) -> bool:
    """A flex-tier request's tag (an untagged request's place holds ``inf``: not flex)."""
    return FLEX_TAG <= tag < math.inf
