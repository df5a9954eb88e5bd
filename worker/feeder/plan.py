"""What one feed step moves, decided without Kafka: index, read-ahead, shares, quarantine.

:class:`Planner` holds the mover's pure parts — the index of the pending partition
(:mod:`worker.feeder.index`), the read-ahead (:mod:`worker.feeder.readahead`), the fair
share (:mod:`batcher.fairshare`) and the drain of stopped batches
(:mod:`worker.feeder.stops`) — and turns scanned records into the slices of one step.
The mover (:mod:`worker.feeder.mover`) writes a step in one transaction.

*Sealed batches.* A publisher with fair share writes a batch without a transaction (an
idempotent producer) and its end marker last, saying how many records it wrote, once
all of them were acknowledged; each record says so (``batchpipe-sealed``). Such a batch
is indexed and read ahead as it comes but joins fair share only when its marker is read
and as many of its records were (the marker itself is passed over, never moved), so a
batch is never run in part. One whose marker never comes is abandoned once neither a
record nor a heartbeat (``batchpipe-alive``, every 5 s of a slow read) of it came for
:data:`HOLD_S` (its publisher died); one whose marker counts more records than were
read is abandoned at the marker (a record lost: never run in part either).

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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import TypeVar

from confluent_kafka import KafkaException, Message

from batcher.tiers import DEFAULT, Tiers
from worker.feeder.deadlines import Deadlines
from worker.feeder.headers import Charging, Scheduled, headers_of, scheduled_as
from worker.feeder.index import PendingIndex
from worker.feeder.naming import HOLD_S
from worker.feeder.readahead import PartialRead, ReadAhead
from worker.feeder.stops import Drain
from worker.feeder.sweep import FeederError
from worker.kafka.cancellations import Stop

log = logging.getLogger(__name__)

#: batches whose end marker was read, remembered for records published after it
MAX_ENDED = 100_000

T = TypeVar("T")


@dataclass
class _Held:
    """A sealed batch's records scanned before its end marker: not in fair share yet."""

    key: str
    weight: float
    tier: str = DEFAULT
    count: int = 0
    tokens: float = 0.0
    seen: float = 0.0


@dataclass
class Step:
    """One step's moves: per batch its records in order, how many were shared (counted
    against the credits), and the quarantines to announce with it."""

    slices: list[tuple[str, list[Message]]] = field(default_factory=list)
    #: each shared slice's virtual tag and what each of its requests adds to it
    #: (:attr:`FairShare.tag`, :attr:`FairShare.tag_step`), in order after the drains
    tags: list[tuple[float, float]] = field(default_factory=list)
    shared: int = 0
    #: how many of ``slices``, first, are stopped batches' drains (not shared)
    drains: int = 0
    stops: list[Stop] = field(default_factory=list)
    #: batches whose unreadable records were marked fed (their cursors move too)
    abandoned: dict[str, int] = field(default_factory=dict)
    #: shared records per service tier of their batch (batcher/tiers.py)
    by_tier: Counter[str] = field(default_factory=Counter)
    #: how many shared records a priority batch was fed ahead (tag 0: written first)
    front: int = 0

    @property
    def fed(self) -> list[str]:
        """Every batch whose cursor this step moves, once each."""
        return list(dict.fromkeys([*(b for b, _ in self.slices), *self.abandoned]))

    @property
    def moved(self) -> int:
        return sum(len(records) for _, records in self.slices)

    def written(
        self, placed: Sequence[int], beyond: int, over: int
    ) -> list[tuple[Message, float, int | None, bool]]:
        """The shared records in the order they are written, each with its own virtual tag,
        its partition and whether it is fed beyond credit: lowest tag first (equal tags in
        slice order, a slice's own order kept), the order a worker would start them in. A
        worker reads its partition in order and reorders only what it holds, so slices
        written one after the other were started one after the other: several newly active
        batches fed in one step now reach it a request of each in turn.

        ``placed`` is :meth:`Credits.place`'s answer, the places within credit first and
        the last ``beyond`` of them beyond it; the records fed beyond credit are the last
        ``over`` in slice order (what fair share served once the room was spent, a newly
        active batch's first slice). Each kind takes its own places, in write order, so the
        labels stay on those records although a newcomer's low tags write them first; a
        record left without a place has None."""
        first_over = self.shared - over
        within, extra = iter(placed[: len(placed) - beyond]), iter(placed[len(placed) - beyond :])
        number = count()  # each record's place in slice order
        numbered = [
            (start, [(next(number), m) for m in records])
            for start, (_, records) in zip(self.tags, self.slices[self.drains :], strict=True)
        ]
        out: list[tuple[Message, float, int | None, bool]] = []
        for (i, m), tag in in_tag_order(numbered):
            is_over = i >= first_over
            partition = next(extra if is_over else within, None)
            out.append((m, tag, partition, is_over and partition is not None))
        return out


def in_tag_order(
    slices: Sequence[tuple[tuple[float, float], Sequence[T]]],
) -> list[tuple[T, float]]:
    """Each item of ``slices`` (``((start, step), items)``: the i-th item's tag is
    ``start + i × step``) with its tag, all of them lowest tag first; a stable sort, so
    equal tags keep the slices' order."""
    tagged = [
        (item, start + i * per) for (start, per), items in slices for i, item in enumerate(items)
    ]
    return sorted(tagged, key=lambda pair: pair[1])


class Planner:
    def __init__(
        self,
        index: PendingIndex,
        fair: Tiers,
        ahead: ReadAhead,
        drain: Drain,
        charging: Charging,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        engine: int | None = None,
    ) -> None:
        self.index = index
        #: a worker's engine batch: newly active batches share it for their first slices
        #: (:meth:`FairShare.first_slice`); None: a first slice is a whole one
        self._engine = engine
        self.fair = fair
        self.ahead = ahead
        self.drain = drain
        self._charging = charging
        self._stops: list[Stop] = []  # quarantines not yet announced
        self._abandoned: dict[str, int] = {}  # not yet in a step
        self._held: dict[str, _Held] = {}  # sealed batches whose end marker is not read yet
        self._ended: dict[str, None] = {}  # batches whose end marker was read (bounded)
        self._clock = clock
        self.deadlines = Deadlines(wall)  # the batches at risk are fed first

    def note(self, records: Sequence[Message]) -> None:
        """Index records the scan read from the pending partition, in offset order."""
        for m in records:
            to = scheduled_as(headers_of(m), m.value(), self._charging)
            try:
                offset = m.offset()
                assert offset is not None
                if to.end:
                    self.index.skip(offset)
                    self._end(to.batch_id, to.count)
                    continue
                if to.alive:
                    self.index.skip(offset)
                    if (held := self._held.get(to.batch_id)) is not None:
                        held.seen = self._clock()
                    continue
                first = to.batch_id not in self.index.batches
                if self.index.scan(offset, to.batch_id, to.weight):
                    self.ahead.scanned(to.batch_id, m, first)
                    if not self.drain.stopped(to.batch_id):
                        self._share(to.batch_id, to)
            except KafkaException:
                raise
            except Exception as exc:
                self.quarantine(to.batch_id, f"scanning offset {m.offset()}: {_cause(exc)}")

    def _share(self, batch_id: str, to: Scheduled) -> None:
        """A record of ``batch_id`` joins fair share, or waits with its batch's until the
        end marker of a sealed batch is read."""
        weight = self.index.batches[batch_id].weight
        if to.deadline is not None:
            self.deadlines.note(batch_id, to.deadline)
        if not to.sealed or batch_id in self._ended:
            self.fair.add(batch_id, 1, weight, to.key, to.tokens, to.tier)
            return
        held = self._held.get(batch_id)
        if held is None:
            held = self._held[batch_id] = _Held(to.key, weight, to.tier)
        held.count, held.tokens, held.seen = held.count + 1, held.tokens + to.tokens, self._clock()

    def _end(self, batch_id: str, count: int | None) -> None:
        """``batch_id``'s end marker was read: its publisher wrote ``count`` records and
        had every one acknowledged. Fed when at least as many were read (more: an earlier
        attempt under the same id left some, and readers keep one answer per
        ``custom_id``); abandoned when fewer were, so it never runs in part (unless an
        earlier feeder fed some of it: it checked the count then)."""
        if len(self._ended) >= MAX_ENDED:
            self._ended.pop(next(iter(self._ended)))  # the oldest: long fed
        self._ended[batch_id] = None
        held = self._held.pop(batch_id, None)
        if held is None or batch_id not in self.index.batches or self.drain.stopped(batch_id):
            return
        # a batch fed in part already had its marker read and checked by an earlier feeder;
        # a takeover reads only what of it is unfed
        if count is not None and held.count < count and not self.index.fed_to.get(batch_id):
            self._abandon(
                batch_id,
                FeederError(f"its end marker counts {count} records, {held.count} were read"),
            )
            return
        tokens = held.tokens / held.count
        self.fair.add(batch_id, held.count, held.weight, held.key, tokens, held.tier)

    def _expire(self) -> None:
        """A sealed batch with no record or heartbeat for :data:`HOLD_S` and no end marker:
        its publisher died before it wrote the rest, so what it wrote is no accepted batch
        (the publisher failed; ``serve`` publishes it again whole). Abandoned, said,
        counted."""
        now = self._clock()
        for batch_id in [b for b, h in self._held.items() if now - h.seen > HOLD_S]:
            del self._held[batch_id]
            if batch_id in self.index.batches:
                self._abandon(batch_id, FeederError(f"no end marker, nothing for {HOLD_S:.0f} s"))

    def plan(
        self,
        room: int,
        budget: int,
        fresh: int = 0,
        rate: float = 0.0,
        flex_room: int | None = None,
    ) -> Step:
        """Up to ``budget`` records: stopped batches' first (outside the shares and the
        credits), then batches at risk of missing their deadline at the fleet's ``rate``
        (requests a second, :mod:`worker.feeder.deadlines`), earliest deadline first, in
        at most ``EDF_SHARE`` of the room over the steps (a fraction left is carried to
        the next), then what the tiers choose within the rest (priority batches within
        their keys' allowance, fair share, flex only when nothing else waits:
        :class:`batcher.tiers.Tiers`); a batch never fed yet
        may have its first slice beyond ``room``, all of them together by up to ``fresh``
        records (newcomers first, §10: :meth:`Credits.overdraft`), and all of them
        together one engine batch (:meth:`FairShare.first_slice`)."""
        if self._held:
            self._expire()
        step = Step(stops=self._stops, abandoned=self._abandoned)
        self._stops, self._abandoned = [], {}
        step.slices = self.drain.slices(self.ahead, budget, self._abandon)
        step.drains = len(step.slices)
        left = budget - step.moved
        room = min(room, left)
        cap = self.ahead.slice_cap(len(self.fair))  # a round's slices fit the read-ahead
        risky = self.deadlines.at_risk(rate, self.fair.waiting, self.index.batches)
        self.deadlines.accrue(room, bool(risky))
        self.fair.accrue(room, flex_room)  # priority's allowance, flex's room (batcher/tiers)
        for batch_id in risky:
            if (edf := min(self.deadlines.allowance(), cap)) < 1:
                break
            moved = self._take(step, batch_id, self.fair.serve(batch_id, edf))
            self.deadlines.spent(moved)
            room, left = room - moved, left - moved
        first = None if self._engine is None else self.fair.first_slice(self._engine)
        while left > 0:
            over = min(fresh, left - room, cap - min(room, cap))
            if (picked := self.fair.next(min(room, cap), over, first)) is None:
                break
            moved = self._take(step, *picked)
            fresh -= max(0, moved - room)  # the fleet's overdraft is shared by every newcomer
            room, left = max(0, room - moved), left - moved
        step.stops.extend(self._stops)  # quarantined while planning: announced now
        step.abandoned.update(self._abandoned)
        self._stops, self._abandoned = [], {}
        return step

    def _take(self, step: Step, batch_id: str, count: int) -> int:
        """The ``count`` records of ``batch_id`` fair share just served, into ``step`` with
        the slice's tag; returns how many (fewer when reading them back failed)."""
        if count < 1:
            return 0
        tag, tier, ahead = (self.fair.tag, self.fair.tag_step), self.fair.tier, self.fair.ahead
        try:
            records = self.ahead.take(batch_id, count)
        except KafkaException:
            raise
        except Exception as exc:
            self.quarantine(batch_id, f"reading its records back: {_cause(exc)}")
            records = exc.taken if isinstance(exc, PartialRead) else []
        if records:
            step.slices.append((batch_id, records))
            step.tags.append(tag)
            step.shared += len(records)
            step.by_tier[tier] += len(records)
            step.front += len(records) if ahead else 0
        return len(records)

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
