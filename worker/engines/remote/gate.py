"""The server's own queue, read from its Prometheus ``/metrics``; and when flex-tier work
may start on a server shared with interactive traffic.

vLLM exports ``vllm:num_requests_waiting`` (requests accepted but not yet scheduled,
one series per model). While it is above ``engine.remote.max_waiting`` the server is
already behind on someone's traffic, so the remote engine sends nothing new and halves its
AIMD window once a round trip while readings find a queue: batch work only fills capacity
that nobody else is using, and shrinks while interactive requests wait.

One reading is enough, although a request always waits for the server's next step and
so shows in the queue briefly: waiting for two readings in a row was tried
(``python -m bench.remote --quick``): the batch ran about four times faster in the idle
phases, but held the server's last slots when a burst began, and interactive P99 rose
from 1.0× to 1.5× of alone. A reading has one deadline (``timeout_s``, at most 5 s) and
reads at most 8 MiB, so an endless or dripping page cannot stall it. A read that fails
leaves the gate open
(the AIMD window still reacts to 429/503 and timeouts) and shows as -1 in
``batchpipe_remote_server_waiting``.

*Flex gives way first* (:class:`FlexYield`, docs/architecture.md §10 "Service tiers"). A
flex batch asked to run only on capacity nobody else wants; on a shared server that
includes the server's interactive traffic, which the feeder cannot see. So flex work
starts only while the server has shown no pressure for ``engine.remote.flex_quiet_ms``:
no queue reading above 0 (stricter than ``max_waiting``, which the other tiers keep),
no 429/502–504, timeout or answer slower than ``latency_target_ms``. A queue counts only
when someone else is on the server (:func:`someone_else`): the batch's own requests
show in the queue for a step each, and flex must not give way to itself (measured: a
flex batch alone on an idle server ran at 3 answers/s against a default batch's 11
before this, ``python -m bench.remote --tiers``). Pressure closes
flex at once, before the AIMD window of the other tiers has halved even once, and it
reopens only after the quiet period, since interactive traffic comes in bursts: a queue
that emptied for one reading is usually the gap between two requests of the same burst.
"""

from __future__ import annotations

import math

WAITING_SERIES = "vllm:num_requests_waiting"
RUNNING_SERIES = "vllm:num_requests_running"


def waiting(exposition: str, series: str = WAITING_SERIES) -> int | None:
    """The sum of ``series`` over its label sets in a Prometheus text exposition; None
    when it is absent or unreadable."""
    total = 0.0
    found = False
    for line in exposition.splitlines():
        if not line.startswith(series) or line[len(series) : len(series) + 1] not in ("{", " "):
            continue
        rest = line[len(series) :]
        if rest.startswith("{"):  # labels (quoted values may hold spaces): after the last }
            rest = rest[rest.rfind("}") + 1 :]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            return None
        if not math.isfinite(value):
            return None
        total += value
        found = True
    return int(total) if found else None


def someone_else(waiting: int, running: int | None, own: int) -> bool:
    """Whether a server's queue holds anyone's requests but the worker's own: it holds
    more requests, waiting and running (``vllm:num_requests_running``), than the worker
    has in flight. A server that does not export its running count is given the benefit
    of the doubt: any queue is someone else's."""
    return running is None or waiting + running > own


class FlexYield:
    """Whether flex-tier work may start: the server quiet for ``quiet_s``. Pure: the
    caller passes its clock's readings (monotonic seconds)."""

    def __init__(self, quiet_s: float) -> None:
        self.quiet_s = quiet_s
        self._pressure_at = -math.inf
        self.closings = 0  # times pressure closed an open flex gate

    def pressure(self, now: float) -> None:
        """The server showed pressure at ``now`` (a queue, an overload answer)."""
        if self.open(now):
            self.closings += 1
        self._pressure_at = max(self._pressure_at, now)

    def open(self, now: float) -> bool:
        return now - self._pressure_at >= self.quiet_s
