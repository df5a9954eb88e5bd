"""Which batches are at risk of missing their deadline (docs/architecture.md §10).

Every record a publisher writes carries its batch's deadline (``batchpipe-deadline``,
wall-clock seconds: the publisher's start plus the completion window, 24 h), read with a
bound (:mod:`worker.feeder.headers`). A batch is *at risk* when its requests not fed yet,
at the fleet's recent pace (shared records its workers read a second,
:meth:`worker.feeder.credits.Credits.rate`), need more than :data:`RISK_SHARE` of the time
left: with one other tenant, fair share gives it about half the fleet, and it would miss.
The planner (:mod:`worker.feeder.plan`) feeds batches at risk earliest deadline first, as
llm-d's batch gateway orders SLO batches, but in at most :data:`EDF_SHARE` of a step's
room and charged in fair share as their own turns: a deadline is the publisher's claim,
so a tenant that claims an early one on everything starves nobody and pays for what it
was fed out of turn by waiting afterwards. A deadline already passed is no longer at
risk: the batch is expired by whoever watches its window (``serve``, 4006).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container

#: at risk: the unfed requests need more than this share of the time left
RISK_SHARE = 0.5
#: at most this share of a step's room goes to batches at risk
EDF_SHARE = 0.5
#: which batches are at risk is worked out at most this often
RISK_EVERY_S = 1.0


class Deadlines:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._deadlines: dict[str, float] = {}  # per batch, from its first record
        self._risky: list[str] = []  # at risk, earliest deadline first
        self._due = -math.inf

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
            if unfed and rate > 0 and 0 < left * RISK_SHARE < unfed / rate:
                risky.append((deadline, batch_id))
        self._risky = [batch_id for _, batch_id in sorted(risky)]
        return self._risky
