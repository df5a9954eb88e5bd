"""Deliveries: retried with jittered exponential back-off until one answer is 2xx, their
state written after every attempt, given up in time; the same ``webhook-id`` on every
attempt, including the repeat of one whose answer came too late."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.deliveries import Deliverer, Pending, delay_s
from batchpipe.api.webhooks.endpoints import EVENTS, Endpoint
from batchpipe.api.webhooks.metrics import WebhookMetrics
from batchpipe.api.webhooks.sender import Outcome, Sender
from tests.unit.batchpipe.api.fakes import until
from worker.config import ApiConfig

API = ApiConfig(webhook_backoff_s=0.01, webhook_backoff_max_s=0.05)
ENDPOINT = Endpoint("alice", "http://127.0.0.1:9/h", frozenset(EVENTS), b"key")


@dataclass
class MemoryLog:
    owed: dict[str, Pending] = field(default_factory=dict)
    writes: list[tuple[str, int | None]] = field(default_factory=list)  # (id, attempts)

    def load(self) -> list[Pending]:
        return list(self.owed.values())

    def put(self, pending: Pending) -> None:
        self.owed[pending.webhook_id] = pending
        self.writes.append((pending.webhook_id, pending.attempts))

    def done(self, webhook_id: str) -> None:
        self.owed.pop(webhook_id, None)
        self.writes.append((webhook_id, None))


@dataclass
class Script:
    """Answers ``failures`` failed attempts, then delivers; records every attempt."""

    failures: int
    seen: list[Mapping[str, str]] = field(default_factory=list)

    def __call__(self, url: str, headers: Mapping[str, str], body: bytes) -> Outcome:
        self.seen.append(headers)
        if len(self.seen) <= self.failures:
            return Outcome("failed", "HTTP 500")
        return Outcome("delivered", "204")


def pending(webhook_id: str = "wh_1", since: float = 0.0, **changes: object) -> Pending:
    item = Pending(webhook_id, "alice", "batch.completed", '{"id":"evt_1"}', since or time.time())
    return replace(item, **changes)  # type: ignore[arg-type]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def deliverer(
    send: object,
    log: MemoryLog,
    registry: CollectorRegistry,
    api: ApiConfig = API,
    url: str = ENDPOINT.url,
) -> Deliverer:
    endpoints = {"alice": replace(ENDPOINT, url=url)}
    found = Deliverer(api, endpoints, send, log, WebhookMetrics(registry))  # type: ignore[arg-type]
    found.start()
    return found


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_failing_receiver_is_retried_until_it_answers(registry: CollectorRegistry) -> None:
    log, script = MemoryLog(), Script(failures=3)
    log.put(pending())
    hooks = deliverer(script, log, registry)
    hooks.resume()
    assert until(lambda: not log.owed)
    hooks.close()
    assert len(script.seen) == 4
    assert {h["webhook-id"] for h in script.seen} == {"wh_1"}
    assert log.writes == [("wh_1", 0), ("wh_1", 1), ("wh_1", 2), ("wh_1", 3), ("wh_1", None)]
    assert value(registry, "batchpipe_api_webhook_deliveries_total", outcome="failed") == 3
    assert value(registry, "batchpipe_api_webhook_deliveries_total", outcome="delivered") == 1
    assert value(registry, "batchpipe_api_webhook_retries_total") == 3


def test_back_off_doubles_with_jitter_up_to_its_cap() -> None:
    api = ApiConfig(webhook_backoff_s=5, webhook_backoff_max_s=3600)
    assert [delay_s(api, n, lambda: 0.0) for n in (1, 2, 3)] == [2.5, 5.0, 10.0]
    assert [delay_s(api, n, lambda: 1.0) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    assert delay_s(api, 40, lambda: 1.0) == 3600 and delay_s(api, 40, lambda: 0.0) == 1800


def test_a_delivery_failing_past_its_time_is_given_up(registry: CollectorRegistry) -> None:
    log = MemoryLog()
    log.put(pending(since=time.time() - 3 * 3600))
    hooks = deliverer(
        Script(failures=100), log, registry, replace(API, webhook_give_up_after_s=3600)
    )
    hooks.resume()
    assert until(lambda: not log.owed)
    hooks.close()
    assert value(registry, "batchpipe_api_webhook_deliveries_total", outcome="gave_up") == 1


def test_released_work_is_no_longer_sent_and_the_oldest_age_is_reported(
    registry: CollectorRegistry,
) -> None:
    log = MemoryLog()
    log.put(pending(since=time.time() - 100, next_at=time.time() + 3600))
    hooks = deliverer(Script(failures=0), log, registry)
    hooks.resume()
    assert hooks.oldest_age_s(time.time()) >= 100
    hooks.release()
    assert hooks.oldest_age_s(time.time()) == 0.0
    hooks.close()
    assert "wh_1" in log.owed  # still owed, for whoever delivers next


class Late(BaseHTTPRequestHandler):
    """Takes every delivery, but answers the first one only after the second arrived."""

    seen: ClassVar[list[str]] = []
    second = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.seen.append(self.headers["webhook-id"])
        if len(self.seen) == 1:
            self.second.wait(30)
        else:
            self.second.set()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def late() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Late)
    Late.seen, Late.second = [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    Late.second.set()
    server.shutdown()
    server.server_close()


def test_an_answer_after_the_timeout_is_a_repeat_with_the_same_webhook_id(
    late: str, registry: CollectorRegistry
) -> None:
    """When a repeat happens: the receiver took the delivery but answered too late."""
    api = replace(API, webhook_timeout_s=0.5, webhook_allow_networks=("127.0.0.1/32",))
    sender = Sender(AddressGuard(api.webhook_allow_networks), api.webhook_timeout_s)
    log = MemoryLog()
    log.put(pending())
    hooks = deliverer(sender.send, log, registry, api, url=late)
    hooks.resume()
    assert until(lambda: not log.owed)
    hooks.close()
    sender.close()
    assert Late.seen == ["wh_1", "wh_1"]


def test_an_attempt_that_raises_is_a_failed_attempt_with_back_off_and_give_up(
    registry: CollectorRegistry,
) -> None:
    """Whatever a receiver provokes in the sender (a bug in it, say) counts as a failed
    attempt, so it backs off and is given up in time, instead of looping at a fixed pace."""

    def raising(url: str, headers: Mapping[str, str], body: bytes) -> Outcome:
        raise TypeError("provoked")

    api = replace(API, webhook_give_up_after_s=0.3)
    log = MemoryLog()
    log.put(pending())
    hooks = deliverer(raising, log, registry, api)
    hooks.resume()
    assert until(lambda: not log.owed)
    hooks.close()
    attempts = [n for _, n in log.writes if n is not None]
    assert attempts == list(range(len(attempts))) and len(attempts) >= 2
    assert value(registry, "batchpipe_api_webhook_deliveries_total", outcome="gave_up") == 1
