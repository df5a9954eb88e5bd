"""The webhooks' series on the API's ``/metrics``: attempts by outcome, retries, the
age of the oldest event not yet delivered (on the replica that delivers; 0 elsewhere),
and whether this replica is the one that delivers.
No label carries an owner's URL or secret."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

OUTCOMES = ("delivered", "failed", "gave_up", "refused")


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._attempts = Counter(
            "batchpipe_api_webhook_deliveries",
            "Webhook delivery attempts by outcome: delivered (2xx), failed (retried later), "
            "gave_up (failing past api.webhook_give_up_after_s), refused (the address guard on "
            "the configured URL, or the key's endpoint gone).",
            ["outcome"],
            registry=registry,
        )
        self._retries = Counter(
            "batchpipe_api_webhook_retries",
            "Webhook deliveries scheduled again after a failed attempt.",
            registry=registry,
        )
        self._oldest = Gauge(
            "batchpipe_api_webhook_oldest_undelivered_seconds",
            "Age of the oldest event this replica still owes a receiver (0: none owed).",
            registry=registry,
        )
        self._delivering = Gauge(
            "batchpipe_api_webhook_delivering",
            "1 on the replica that relays batch events and delivers webhooks now, else 0.",
            registry=registry,
        )
        for outcome in OUTCOMES:
            self._attempts.labels(outcome)

    def attempt(self, outcome: str) -> None:
        self._attempts.labels(outcome).inc()
        if outcome == "failed":
            self._retries.inc()

    def watch(self, oldest_s: Callable[[], float], delivering: Callable[[], bool]) -> None:
        self._oldest.set_function(oldest_s)
        self._delivering.set_function(lambda: float(delivering()))
