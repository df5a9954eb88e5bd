"""How much the feeder may give each worker: credits from the workers' demand reports.

Each worker reports what it holds unanswered, what its engine runs and what more it
could start (:mod:`worker.feeder.demand`). The feeder keeps each worker at *running + one
batch*: a worker's credit is its engine's free room plus a cushion, less what it holds
waiting and what the feeder already wrote to its partitions and the worker has not read
(counted from the feeder's own deliveries against the positions the worker reported)::

    credit = free + cushion − (held − running) − unread
    queue = batch − engine;  reads = read/s × CUSHION_S
    cushion = max(engine − queue, reads if reads > queue else 0)

``batch`` is a worker's slots (``batching.prefetch_count``) and ``engine`` one engine
batch (``batching.max_batch_size``); the slots beyond an engine batch are a *queue* the
worker already holds. When its engine frees a whole batch at once (a static engine, or
an in-flight one whose requests started together), the worker starts the queued
requests (after admitting what it read ahead, a newcomer's first slice among them) and
reads the topic to fill its slots again, so the topic has to hold only what an engine
batch takes beyond that queue: nothing with the defaults (64 slots, 32 an engine
batch), one batch where the two are equal. *reads* covers what a fast worker
takes between two reports (the feeder's own shared records its positions passed, per
second of its reports' clock), where its queue would not: a queue that holds them
covers the report's lag by itself (the fake-clock fleet of ``test_credits`` keeps its
capacity either way; subtracting the queue from a fast worker's reads cost it 6 % at a
request a step). What the topic holds is read in order before any record fed after it,
a newly active batch's too, so the cushion is no larger than keeping the engine busy
needs: a floor of one ``prefetch_count``, 8 s of work at 1 s a decoding step, made a
small batch 4.2× its time alone in ``bench.fairness``.

Nothing is derived from committed offsets or round trips, so a long generation pins
nothing and a slow step needs no probe: a worker that runs 64 requests of 10 s and one
of 500 s still reports 64 running and its free room.
Only records the feeder shared count as unread or read: a stopped batch's drain and
records other producers wrote are never counted, so a cancel inflates nothing. A report
is as old as ``REPORT_S`` plus the read: the answers given since then are not credited
yet, so the error is on the side of feeding less, never of a deeper topic.

A worker whose last report was read, or written, more than :data:`STALE_S` ago has no
credit (a compacted topic keeps dead workers' last reports; a report dated more than
that ahead of the feeder's clock is refused alike) (it died, or left): its partitions
are fed nothing until a worker that reports holds them, and the records already there
are answered by whoever is assigned them next. When two reports name one partition (a
rebalance under way), the newer report holds it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from worker.feeder.demand import Demand

#: a worker that has not reported for this long has no credit
STALE_S = 3.0
#: the cushion covers what a worker takes in this long: a report's interval (0.1 s), its
#: read (a 25 ms fetch wait) and a feed step, with room to spare; it is also how long a
#: newly active batch may wait behind a fast worker's queue. In the fake-clock fleet of
#: tests/unit/worker/feeder/test_credits.py, with reports 0.3 s late, a worker at a
#: request a step kept 0.99 of capacity (0.38–0.67 with 0.25 s)
CUSHION_S = 0.5
#: a worker's answer rate is measured over at least this long
RATE_SPAN_S = 1.0


@dataclass
class _Worker:
    demand: Demand
    seen: float  # the feeder's clock when the report was read
    read: int = 0  # shared records its positions passed
    history: deque[tuple[float, int]] = field(default_factory=deque)  # (at, read)

    def rate(self) -> float:
        (then, before), (now, after) = self.history[0], self.history[-1]
        return (after - before) / (now - then) if now > then and after >= before else 0.0


class Credits:
    def __init__(
        self,
        batch: int,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        engine: int | None = None,
    ) -> None:
        self._batch = max(1, batch)
        engine = self._batch if engine is None else min(self._batch, max(1, engine))
        self._engine = engine
        #: the slots beyond an engine batch: the worker's own queue (module doc)
        self._queue = self._batch - engine
        self._clock, self._wall = clock, wall
        self._workers: dict[str, _Worker] = {}
        #: per partition, the offsets of shared records written there, ascending
        self._unread: dict[int, deque[int]] = {}
        #: per partition, records given out and not delivered yet
        self._given: dict[int, int] = {}
        #: the same two for the records fed beyond credit (newcomers first, §10): a
        #: worker holds at most one batch of them unread, so many new batches cannot
        #: flood its partitions past what its credit allows
        self._over_unread: dict[int, deque[int]] = {}
        self._over_given: dict[int, int] = {}
        #: how many of the last :meth:`place`'s partitions, last, are beyond credit
        self.beyond = 0
        #: per worker, the partition its newcomers' first slices go to (:meth:`_fresh_lane`)
        self._fresh: dict[str, int] = {}

    def report(self, demand: Demand | None, worker: str | None = None) -> None:
        """A worker's report (None, with its ``worker``: it left and takes no credit)."""
        if demand is None:
            if worker is not None:
                self._workers.pop(worker, None)
            return
        if abs(self._wall() - demand.at) > STALE_S:
            # a dead worker's last report, read back from the compacted topic; or one from
            # the future, which would hold every partition it names (the newer report
            # holds a partition) for as long as it is read back
            return
        known = self._workers.get(demand.worker)
        if known is None or demand.at < known.demand.at:  # new, or a restarted worker
            known = _Worker(demand, self._clock())
            self._workers[demand.worker] = known
        known.demand, known.seen = demand, self._clock()
        for partition, position in demand.positions:
            unread = self._unread.get(partition)
            while unread and unread[0] < position:
                unread.popleft()
                known.read += 1
            over = self._over_unread.get(partition)
            while over and over[0] < position:
                over.popleft()
        known.history.append((demand.at, known.read))
        while len(known.history) > 2 and demand.at - known.history[1][0] >= RATE_SPAN_S:
            known.history.popleft()

    def returned(self, partition: int, over: bool = False) -> None:
        """A record placed on ``partition`` (``over``: beyond credit) was not written
        there (dead-lettered)."""
        self._given[partition] = max(0, self._given.get(partition, 0) - 1)
        if over:
            self._over_given[partition] = max(0, self._over_given.get(partition, 0) - 1)

    def unread(self) -> int:
        """Shared records written and not read yet, over every partition."""
        return sum(len(u) for u in self._unread.values()) + sum(self._given.values())

    def delivered(self, partition: int, offset: int, over: bool = False) -> None:
        """A record the feeder shared was written at ``offset`` of ``partition``
        (``over``: one :meth:`place` gave beyond credit)."""
        self._given[partition] = max(0, self._given.get(partition, 0) - 1)
        _insert(self._unread.setdefault(partition, deque()), offset)
        if over:
            self._over_given[partition] = max(0, self._over_given.get(partition, 0) - 1)
            _insert(self._over_unread.setdefault(partition, deque()), offset)

    def credits(self) -> dict[str, int]:
        """Per live worker, how many more records it should get now (may be ≤ 0)."""
        return {name: credit for name, credit, _ in self._live()}

    def room(self, cushion: bool = True) -> int:
        """How many shared records may be fed now, over every worker; without the
        ``cushion``, only what their slots take now and only on workers whose engine
        starts flex work now (the flex tier's room: a flex record left unread in the topic
        would be read before a default batch fed after it; one fed to a worker whose
        server is under pressure would wait there, :mod:`worker.feeder.demand`)."""
        live = self._live(cushion, flex_only=not cushion)
        return sum(max(0, credit) for _, credit, _ in live)

    def place(self, count: int, over: int = 0, front: int = 0) -> list[int]:
        """Partitions for the next ``count`` shared records (fewer when credit runs out),
        spread over the workers with credit and, within a worker, all to one of its
        partitions (:meth:`_lane`); each is counted as given until :meth:`delivered`. The
        first ``front`` of them (a priority batch's, fed ahead, batcher/tiers.py) go to
        the partition where the fewest records wait instead (:meth:`_fresh_lane`): on the
        lane they were written behind the records already unread there, which the worker
        reads first (issue 50: 30 of a 50-line priority batch waited 1.6 s). Up
        to ``over`` of them may go beyond credit (a newly active batch's first slice,
        §10), last (:attr:`beyond` says how many): those go to the live workers in turn,
        the most credit first, each while it holds less than one batch of them unread
        (:meth:`overdraft`)."""
        workers = self._live()
        live = [(name, credit, mine) for name, credit, mine in workers if credit > 0]
        out: list[int] = []
        while live and len(out) < count:
            left: list[tuple[str, int, list[int]]] = []
            for name, credit, mine in live:
                if len(out) >= count:
                    break
                ahead = len(out) < front
                partition = self._fresh_lane(name, mine) if ahead else self._lane(mine)
                self._given[partition] = self._given.get(partition, 0) + 1
                out.append(partition)
                if credit > 1:
                    left.append((name, credit - 1, mine))
            live = left
        within = len(out)
        if within > front:  # newcomers no longer follow onto a lane fed within credit
            used = set(out[front:])
            self._fresh = {w: p for w, p in self._fresh.items() if p not in used}
        beyond = min(over, count - within)
        ranked = sorted(workers, key=lambda w: -w[1])  # the most credit (least behind) first
        allow = {i: self._batch - self._overdrawn(w[2]) for i, w in enumerate(ranked)}
        while len(out) - within < beyond and (turn := [i for i, a in allow.items() if a > 0]):
            for i in turn[: beyond - (len(out) - within)]:
                partition = self._fresh_lane(ranked[i][0], ranked[i][2])
                self._given[partition] = self._given.get(partition, 0) + 1
                self._over_given[partition] = self._over_given.get(partition, 0) + 1
                out.append(partition)
                allow[i] -= 1
        self.beyond = len(out) - within
        return out

    def overdraft(self) -> int:
        """How many records may be fed beyond credit now: per live worker, one batch
        less what it already holds of them unread (given, or written and not read)."""
        return sum(max(0, self._batch - self._overdrawn(mine)) for _, _, mine in self._live())

    def _overdrawn(self, mine: list[int]) -> int:
        return sum(len(self._over_unread.get(p, ())) + self._over_given.get(p, 0) for p in mine)

    def rate(self) -> float:
        """Shared records the live workers read a second (each over the last second of
        its reports): the fleet's recent pace, whose inverse is its time per request."""
        now = self._clock()
        return sum(w.rate() for w in self._workers.values() if now - w.seen <= STALE_S)

    def live(self) -> bool:
        """Whether any worker reports (a record fed beyond credit has somewhere to go)."""
        return bool(self._live())

    def idle(self) -> bool:
        """Whether a live worker reports free slots, or no worker reports at all: with
        requests waiting and nothing fed, a stall (:mod:`worker.feeder.stall`), not a
        fleet busy with long requests."""
        live = self._live()
        return not live or any(self._workers[name].demand.free > 0 for name, _, _ in live)

    def _live(
        self, with_cushion: bool = True, flex_only: bool = False
    ) -> list[tuple[str, int, list[int]]]:
        """(worker, credit, the partitions it holds) for every worker reporting (with
        ``flex_only``, every one whose engine starts flex work now)."""
        now = self._clock()
        for name in [n for n, w in self._workers.items() if now - w.seen > 10 * STALE_S]:
            del self._workers[name]  # long gone: forget it
        live = {n: w for n, w in self._workers.items() if now - w.seen <= STALE_S}
        holders: dict[int, str] = {}
        for name, w in live.items():
            for partition, _ in w.demand.positions:
                other = holders.get(partition)
                if other is None or live[other].demand.at < w.demand.at:
                    holders[partition] = name
        out: list[tuple[str, int, list[int]]] = []
        for name, w in live.items():
            d = w.demand
            mine = [p for p, _ in d.positions if holders[p] == name]
            if not mine or (flex_only and not d.flex):
                continue
            cushion = self.cushion(w.rate()) if with_cushion else 0
            credit = d.free + cushion - (d.held - d.running) - self._unread_of(d, mine)
            out.append((name, credit, mine))
        return out

    def describe(self) -> str:
        """Every worker known and how its credit is made, for a log line: ``name`` (or
        ``name stale <s>`` for one whose report is too old), its credit, ``free``,
        ``held``, ``running``, ``unread`` and the partitions it holds at the positions it
        reported."""
        now = self._clock()
        live = {name: (credit, mine) for name, credit, mine in self._live()}
        parts: list[str] = []
        for name, w in sorted(self._workers.items()):
            d = w.demand
            if name not in live:
                age = now - w.seen
                parts.append(f"{name} stale {age:.1f}s" if age > STALE_S else f"{name} holds none")
                continue
            credit, mine = live[name]
            positions = dict(d.positions)
            at = ",".join(f"{p}@{positions[p]}" for p in mine)
            parts.append(
                f"{name} credit {credit} free {d.free} held {d.held} running {d.running}"
                f" unread {self._unread_of(d, mine)} [{at}]"
            )
        return "; ".join(parts) or "no worker reports"

    def _unread_of(self, demand: Demand, mine: list[int]) -> int:
        """What the feeder wrote to ``mine`` at or above the positions ``demand`` reported,
        delivered or given and not delivered yet."""
        positions = dict(demand.positions)
        return sum(self._count_from(p, positions[p]) + self._given.get(p, 0) for p in mine)

    def cushion(self, rate: float) -> int:
        """What the topic should hold for a worker reading ``rate`` shared records a
        second (module doc): one engine batch less its own queue, or its reads in
        :data:`CUSHION_S` where its queue holds less than that."""
        reads = int(rate * CUSHION_S)
        return max(self._engine - self._queue, reads if reads > self._queue else 0)

    def _lane(self, mine: list[int]) -> int:
        """The one partition of a worker's ``mine`` its shared records go to: the one with
        the most unread (the lowest of equals), so the worker reads them in the order they
        were fed. Spread over its partitions, they were overtaken: a worker reads its
        partitions in whatever order their fetches return, and after a pause one was
        passed over for several cycles (bench.fairness at 1 s a step: records fed 4-16 s
        after one were answered before it was read; small batches 12× slower)."""
        return max(mine, key=lambda p: (self._backlog(p), -p))

    def _fresh_lane(self, name: str, mine: list[int]) -> int:
        """The partition of worker ``name``'s ``mine`` that newly active batches' first
        slices go to: the one where the fewest records wait ahead of them, read and not
        answered (its last report's ``unanswered``) or not read yet (the lowest of equals),
        kept for the next newcomers until a record fed within credit goes there.

        A worker starts a newcomer's requests ahead of those it holds (their tags are
        lower), but answers leave a partition in offset order: behind the batch's own
        queued requests on one partition, a small batch ran in the next engine batch and
        was answered only with the queued ones, one engine batch (4 s) later
        (``bench.fairness`` at 1 s a step). Kept, the lane holds the newcomers in the order
        they were fed, which is the order the worker reads them in; each on the emptiest
        partition in turn, they were read in whatever order the partitions' fetches
        returned, and which small batches made the next engine batch whole was chance."""
        kept = self._fresh.get(name)
        if kept in mine:
            return kept
        waiting = dict(self._workers[name].demand.unanswered)
        lane = self._fresh[name] = min(
            mine, key=lambda p: (waiting.get(p, 0) + self._backlog(p), p)
        )
        return lane

    def _backlog(self, partition: int) -> int:
        return len(self._unread.get(partition, ())) + self._given.get(partition, 0)

    def _count_from(self, partition: int, position: int) -> int:
        unread = self._unread.get(partition)
        return 0 if not unread else len(unread) - bisect_left(unread, position)


def _insert(offsets: deque[int], offset: int) -> None:
    """``offset`` into the ascending ``offsets`` (almost always at the end)."""
    if not offsets or offset > offsets[-1]:
        offsets.append(offset)
    else:
        offsets.insert(bisect_left(offsets, offset), offset)
