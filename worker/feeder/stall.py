"""A feeder that has requests waiting and feeds nothing while workers have free slots
says so (issue 50).

Feeding by credit (:mod:`worker.feeder.credits`) stops by design when every worker is
full, and then nothing is logged: the workers' answers free slots and the next step
feeds. But a credit that stays spent while the workers sit idle — their reports never
passing what the feeder wrote, or no report read at all — stopped a fleet without a word:
a chaos run ended with 640 answers of 4,000 after 300 s, every worker idle, and nothing
in any log said why. :class:`StallWatch` turns that into a warning naming each worker's
credit and how it is made (:meth:`Credits.describe`), repeated while it lasts.

Pure logic: the clock is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: requests waiting and nothing fed for this long, with a worker's slots free, is a stall
STALL_S = 30.0


class StallWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic, after_s: float = STALL_S):
        self._clock = clock
        self._after_s = after_s
        self._since: float | None = None  # since when requests waited and nothing was fed
        self._due = 0.0  # when the next warning is due

    def step(self, waiting: int, moved: int, idle: Callable[[], bool]) -> float | None:
        """One feed step that moved ``moved`` with ``waiting`` requests in the shares:
        how long nothing was fed when a warning is due, else None. Due once ``after_s``
        passed without a record fed while requests wait and ``idle()`` says a worker has
        free slots or none reports (asked only then: it walks every worker's report), then
        again every ``after_s`` while it lasts; workers that are all full are busy, not
        stalled."""
        now = self._clock()
        if moved or not waiting:
            self._since = None
            return None
        if self._since is None:
            self._since, self._due = now, now + self._after_s
            return None
        if now < self._due or not idle():
            return None
        self._due = now + self._after_s
        return now - self._since
