"""Which batches are at risk of missing their deadline (docs/architecture.md §10).

Every record a publisher writes carries its batch's deadline (``batchpipe-deadline``,
wall-clock seconds: the publisher's start plus the completion window, 24 h), read with a
bound (:mod:`worker.feeder.headers`). A batch is *at risk* when its requests not fed yet,
at the fleet's recent pace (shared records its workers read a second,
:meth:`worker.feeder.credits.Credits.rate`), need more than :data:`RISK_SHARE` of the time
left: with one other tenant, fair share gives it about half the fleet, and it would miss.
A batch that would miss even with the whole fleet (its unfed requests need more than
all the time left) is not at risk but hopeless: fair share alone serves it. The planner
(:mod:`worker.feeder.plan`) feeds batches at risk earliest deadline first, as llm-d's
batch gateway orders SLO batches, but in at most :data:`EDF_SHARE` of the room summed
over the steps (the fraction a step leaves is carried to the next, at most one step's
worth or one record banked) and charged in fair share as their own turns: a deadline is
the publisher's claim, so a tenant that claims an early one on everything starves nobody
of more than that share, and its fair-share turns come only after what it was fed out of
turn (EDF itself does not look at its tag: it keeps its share while the batch is at risk).
A deadline already passed is no longer at risk: the batch is expired by whoever watches
its window (``serve``, 4006).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container

#: at risk: the unfed requests need more than this share of the time left
RISK_SHARE = 0.5
#: at most this share of the steps' room, summed, goes to batches at risk
EDF_SHARE = 0.5
#: which batches are at risk is worked out at most this often
RISK_EVERY_S = 1.0


class Deadlines:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._deadlines: dict[str, float] = {}  # per batch, from its first record
        self._risky: list[str] = []  # at risk, earliest deadline first
        self._due = -math.inf
        self._edf = 0.0  # records EDF may feed now: EDF_SHARE of each step's room, carried

    def __len__(self) -> int:
        return len(self._deadlines)

    def note(self, batch_id: str, deadline: float) -> None:
        """``batch_id``'s deadline, as its first record with one says (a later record
        cannot move it)."""
        self._deadlines.setdefault(batch_id, deadline)

    def at_risk(
        self, rate: float, waiting: Callable[[str], int], active: Container[str]
    ) -> list[str]:
        """Batches at risk at the fleet's ``rate`` (requests a second), earliest deadline
        first; ``waiting(batch)`` is how many of its requests are not fed yet, and a batch
        not in ``active`` is forgotten (fed, finished or abandoned)."""
        now = self._wall()
        if now < self._due:
            return self._risky
        self._due = now + RISK_EVERY_S
        risky: list[tuple[float, str]] = []
        for batch_id, deadline in list(self._deadlines.items()):
            if batch_id not in active:
                del self._deadlines[batch_id]
                continue
            unfed, left = waiting(batch_id), deadline - now
            # beyond the whole fleet's pace it is hopeless: EDF would only take half the
            # fleet until the deadline passes, for nothing; fair share serves it
            if unfed and rate > 0 and 0 < left * RISK_SHARE < unfed / rate <= left:
                risky.append((deadline, batch_id))
        self._risky = [batch_id for _, batch_id in sorted(risky)]
        return self._risky

    def accrue(self, room: int, risky: bool) -> None:
        """A step with ``room`` begins: EDF's share of it is added to the allowance, whose
        fraction carries to the next step (rounding each step's half up gave batches at
        risk every record at a room of 1). Banked only while a batch is ``risky``, and at
        most one step's worth or one record, so it never comes in a burst."""
        share = room * EDF_SHARE
        self._edf = min(self._edf + share, max(1.0, share)) if risky else 0.0

    def allowance(self) -> int:
        """How many records batches at risk may be fed now."""
        return math.floor(self._edf)

    def spent(self, count: int) -> None:
        self._edf -= count
