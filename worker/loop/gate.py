"""Requests of batches published without fair share, held until their seal (§7).

:mod:`worker.kafka.seals` says why and what a seal is. Here, the worker's side: a request
with the seal header, decoded and opened in the :class:`~worker.loop.ledger.Ledger` (so
no commit passes it), waits until its batch is ``sealed``; on ``void``, or after
:data:`~worker.kafka.seals.GIVE_UP_S` without a sign of its batch, it is given up (the
loop answers it 4009 without running it). A batch is fed whole or given up whole on every
worker that reads the same signs: the publisher voids rather than seals once it went
:data:`~worker.kafka.seals.SEAL_HOLD_S` without one, and a worker gives up only
``SKEW_S`` after that.

Invariants: a request leaves the gate exactly once — released, given up, or dropped with
its partition (its new owner reads it again); what is held is bounded by the ledger's
``prefetch_count`` slots, which held requests take (a worker full of a killed batch's
requests reads nothing more until it gives that batch up: at most ``GIVE_UP_S``); the
batches remembered as sealed or void are bounded (:data:`KEPT`), the oldest forgotten
first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from batcher import Partition, Pending
from worker.kafka.seals import GIVE_UP_S, Seal
from worker.loop.jobs import Job

#: batches remembered as sealed or void; one forgotten whose requests are read again
#: (a partition rewound past it) waits for a sign and is given up
KEPT = 200_000

Verdict = Literal["pass", "hold", "void"]


class Gate:
    """What of each batch published without fair share waits, and what the control topic
    said of it. ``now`` is the loop's monotonic clock throughout."""

    def __init__(self, give_up_s: float = GIVE_UP_S) -> None:
        self._give_up_s = give_up_s
        self._ended: dict[str, bool] = {}  # batch id -> sealed (True) or void (False)
        self._signed: dict[str, float] = {}  # an open batch -> when its newest sign was read
        self._held: dict[str, list[Pending[Job]]] = {}
        self._released: list[str] = []  # sealed since the last step, with requests held

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self._held.values())

    def see(self, seal: Seal, now: float) -> None:
        """A seal read from the control topic."""
        if seal.batch_id in self._ended:
            return  # the first end read is the batch's: a later one cannot change it
        if seal.state == "open":
            self._signed[seal.batch_id] = now
            return
        self._end(seal.batch_id, sealed=seal.state == "sealed")
        self._signed.pop(seal.batch_id, None)
        if seal.batch_id in self._held:
            self._released.append(seal.batch_id)

    def verdict(self, batch_id: str) -> Verdict:
        """What to do with a request of ``batch_id`` read now."""
        ended = self._ended.get(batch_id)
        return "hold" if ended is None else "pass" if ended else "void"

    def hold(self, pending: Pending[Job], now: float) -> None:
        batch_id = pending.payload.request.batch_id
        self._held.setdefault(batch_id, []).append(pending)
        # the first request read of a batch not signed yet starts its clock: a batch whose
        # open sign was compacted away (its publisher died long ago) is given up in time
        self._signed.setdefault(batch_id, now)

    def step(self, now: float) -> tuple[list[Pending[Job]], list[Pending[Job]]]:
        """The requests released (their batch sealed) and given up (void, or no sign for
        ``give_up_s``) since the last step, each in read order."""
        released: list[Pending[Job]] = []
        given_up: list[Pending[Job]] = []
        for batch_id in self._released:
            jobs = self._held.pop(batch_id, [])
            (released if self._ended.get(batch_id) else given_up).extend(jobs)
        self._released = []
        late = [b for b, at in self._signed.items() if now - at > self._give_up_s]
        for batch_id in late:  # its publisher stopped: given up here and on every worker
            del self._signed[batch_id]
            given_up.extend(self._held.pop(batch_id, ()))
            self._end(batch_id, sealed=False)  # its requests read later are given up too
        return released, given_up

    def _end(self, batch_id: str, *, sealed: bool) -> None:
        if len(self._ended) >= KEPT:
            self._ended.pop(next(iter(self._ended)))  # the oldest: long fed or given up
        self._ended[batch_id] = sealed

    def drop(self, partitions: Sequence[Partition]) -> None:
        """Forget the held requests of ``partitions``: they are read again (here or by
        their new owner), from the committed offset."""
        gone = set(partitions)
        for batch_id in list(self._held):
            kept = [p for p in self._held[batch_id] if p.partition not in gone]
            if kept:
                self._held[batch_id] = kept
            else:
                del self._held[batch_id]
