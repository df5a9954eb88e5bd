"""How many requests a remote engine keeps in flight: additive increase, multiplicative
decrease (AIMD), as TCP shares a link and llm-d's batch gateway shares a fleet.

The server is shared with interactive traffic the worker cannot see. What it can see is
how the server answers its own requests:

* **overload** — 429, 503, a timeout, or (with a latency target) a request slower than
  the target: the window halves, never below ``minimum``. Only a request *sent after*
  the previous cut can cut again, so one burst of failures from requests that were all in
  flight together counts once (the server's verdict on the old window, not the new one).
* **success** within the target: until the first cut the window grows by one request per
  success (slow start: it doubles every round, so a fresh worker reaches the server's
  capacity in a few round trips, not hundreds of successes); after it, by ``1 / window``,
  i.e. by one request per window's worth of successes, up to ``maximum``. (Returning to
  slow start whenever the server's queue reads empty was tried: the batch then ran at
  four times the rate in idle phases, but refilled every slot before each burst and
  interactive P99 rose to 1.7× alone; ``python -m bench.remote --quick``.)

With ``adaptive`` off the window stays at ``maximum``. Pure logic: the caller passes the
clock's readings, so it is tested with a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConcurrencyWindow:
    minimum: int
    maximum: int
    initial: int
    adaptive: bool = True
    #: a request slower than this (seconds, send to last byte) is an overload; 0: off
    latency_target_s: float = 0.0
    decrease: float = 0.5

    def __post_init__(self) -> None:
        self._window = float(self.initial if self.adaptive else self.maximum)
        self._last_cut = float("-inf")
        self.cuts = 0

    @property
    def limit(self) -> int:
        """Requests allowed in flight now (at least ``minimum``)."""
        return int(self._window)

    def on_success(self, sent_at: float, answered_at: float) -> bool:
        """An answer; False when it came later than the latency target (an overload)."""
        if self.latency_target_s and answered_at - sent_at > self.latency_target_s:
            self.on_overload(sent_at, answered_at)
            return False
        if not self.adaptive:
            return True
        step = 1.0 if self.cuts == 0 else 1.0 / self._window
        self._window = min(float(self.maximum), self._window + step)
        return True

    def on_overload(self, sent_at: float, now: float) -> None:
        """A request sent at ``sent_at`` met an overloaded server, as seen at ``now``."""
        if not self.adaptive or sent_at <= self._last_cut:
            return
        self._window = max(float(self.minimum), self._window * self.decrease)
        self._last_cut = now
        self.cuts += 1
