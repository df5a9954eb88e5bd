"""The API server's Prometheus series (``/metrics``), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "batchpipe_api_requests",
            "HTTP requests by method and status class (2xx, 4xx, 5xx).",
            ["method", "status"],
            registry=self.registry,
        )
        self._uploaded = Counter(
            "batchpipe_api_uploaded_bytes", "Bytes of files accepted.", registry=self.registry
        )
        self._batches = Counter(
            "batchpipe_api_batches_created", "Batches created.", registry=self.registry
        )
        for method in ("GET", "POST", "DELETE"):
            for status in ("2xx", "4xx", "5xx"):
                self._requests.labels(method, status)

    def request(self, method: str, status: int) -> None:
        if method in ("GET", "POST", "DELETE"):
            self._requests.labels(method, f"{min(max(status // 100, 2), 5)}xx").inc()

    def uploaded(self, size: int) -> None:
        self._uploaded.inc(size)

    def batch_created(self) -> None:
        self._batches.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
