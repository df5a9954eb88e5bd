"""The remote server's failures in the worker's log, rate-limited (issue 41).

While a server was down, requests failed with 5000 by the hundred and the log said
nothing: httpx logs only the answers it gets. Every failed attempt (a refused or lost
connection, a timeout, a non-200 status) is noted here; the first one is logged at once,
then at most one line per :data:`EVERY_S` saying how many attempts failed since, how
many of them gave a request up, and the last reason. A server that answers again is
logged once, so the log shows both ends of an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("batchpipe.remote")

#: the most often a line about failures is logged
EVERY_S = 10.0


class FailureLog:
    """Counts failed attempts against one server and logs them, rate-limited."""

    def __init__(self, server: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._server = server
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: Counter[str] = Counter()
        self._given_up = 0
        self._last_reason = ""
        self._logged_at: float | None = None
        self._failing = False

    def failed(self, kind: str, reason: str, *, given_up: bool) -> None:
        """One attempt failed (``kind``: connection, timeout, http_5xx, …); ``given_up``:
        its request is answered with an error, not retried."""
        with self._lock:
            self._kinds[kind] += 1
            self._given_up += int(given_up)
            self._last_reason = reason
            self._failing = True
            now = self._clock()
            if self._logged_at is not None and now - self._logged_at < EVERY_S:
                return
            self._logged_at = now
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(self._kinds.items()))
            total, given = sum(self._kinds.values()), self._given_up
            self._kinds.clear()
            self._given_up = 0
        log.warning(
            "remote server %s: %d failed attempts (%s), %d requests given up; the last: %s",
            self._server,
            total,
            kinds,
            given,
            reason,
        )

    def answered(self) -> None:
        """An answer arrived: logged once after failures."""
        if not self._failing:
            return
        with self._lock:
            if not self._failing:
                return
            self._failing = False
            self._logged_at = None
            left = sum(self._kinds.values())
            self._kinds.clear()
            self._given_up = 0
        log.warning(
            "remote server %s answers again (%d failed attempts unlogged)", self._server, left
        )
