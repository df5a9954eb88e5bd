"""What a remote engine tells Prometheus: the server's answers, retries, the AIMD window.

Kept as plain numbers under the engine's lock and turned into metric families only when
scraped (a custom collector), so the request path updates an int and nothing else.
Outcomes are a small fixed set: ``ok``, ``http_4xx``, ``http_429``, ``http_5xx``,
``timeout``, ``connection``, ``unreadable`` (a 200 whose body is not the endpoint's object,
or an answer that cannot be decoded), ``too_large`` (past ``max_response_bytes``),
``http_other`` (a redirect, never followed, or another status that is not 200).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OUTCOMES = (
    "ok",
    "http_4xx",
    "http_429",
    "http_5xx",
    "timeout",
    "connection",
    "unreadable",
    "too_large",
    "http_other",
)


def outcome_of_status(status: int) -> str:
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    return "http_5xx" if status >= 500 else "http_other"


class RemoteStats:
    """Counts kept by the engine (under its lock)."""

    def __init__(self) -> None:
        self.responses: Counter[str] = Counter()
        self.retries = 0
        self.cuts = 0
        self.limit = 0
        self.in_flight = 0
        self.server_waiting = -1  # -1: not read (no metrics_url, or the last read failed)
        self.flex_open = True
        self.flex_closings = 0


class RemoteCollector(Collector):
    """Reads a :class:`RemoteStats` snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], RemoteStats]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        responses = CounterMetricFamily(
            "batchpipe_remote_responses",
            "Answers of the remote server (engine.kind openai) by outcome.",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            responses.add_metric([outcome], s.responses[outcome])
        yield responses
        yield CounterMetricFamily(
            "batchpipe_remote_retries", "Requests sent again to the remote server.", value=s.retries
        )
        yield CounterMetricFamily(
            "batchpipe_remote_backoffs",
            "Times the AIMD window was halved (429, 503, a timeout, a slow answer).",
            value=s.cuts,
        )
        yield GaugeMetricFamily(
            "batchpipe_remote_concurrency_limit",
            "Requests the AIMD window allows in flight now.",
            value=s.limit,
        )
        yield GaugeMetricFamily(
            "batchpipe_remote_in_flight", "Requests sent and not yet answered.", value=s.in_flight
        )
        yield GaugeMetricFamily(
            "batchpipe_remote_server_waiting",
            "The server's own queue (vllm:num_requests_waiting) when read; -1 when not.",
            value=s.server_waiting,
        )
        yield GaugeMetricFamily(
            "batchpipe_remote_flex_open",
            "1 while flex-tier requests may start (the server quiet for flex_quiet_ms), else 0.",
            value=int(s.flex_open),
        )
        yield CounterMetricFamily(
            "batchpipe_remote_flex_yields",
            "Times the server's pressure stopped flex-tier requests from starting.",
            value=s.flex_closings,
        )
