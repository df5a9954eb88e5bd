"""Deliveries in flight: retried with back-off, their state on a compacted Kafka topic.

Every delivery owed is one record on ``<kafka.state_topic>.webhooks`` (one partition,
compacted), keyed by its ``webhook-id``: written by the relay in the transaction that
writes its event (:mod:`.relay`), rewritten after each failed attempt (attempts, when
the next is due), and tombstoned once delivered or given up. Only the replica that owns
the relay's partition delivers; when it takes the partition over it reads this topic to
its end (:meth:`Deliverer.resume`) and carries on where the previous owner stopped, so
a restart loses nothing; when it hands it over (:meth:`Deliverer.release`) it waits
for its attempts in flight first, so two replicas never send one delivery at once.

Back-off: the n-th retry waits ``d/2 + uniform(0, d/2)`` with ``d = min(backoff_max_s,
backoff_s × 2^(n-1))`` — exponential, jittered so that many deliveries failing together
spread out, and never less than half the step so that a down receiver meets no storm.
A delivery is given up ``api.webhook_give_up_after_s`` after its event (72 hours).
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Protocol

from batchpipe.api.webhooks.endpoints import Endpoint
from batchpipe.api.webhooks.metrics import WebhookMetrics
from batchpipe.api.webhooks.sender import Outcome
from batchpipe.api.webhooks.signing import signed_headers
from worker.config import ApiConfig

log = logging.getLogger("batchpipe.api.webhooks")

_SENDERS = 4
_RELEASE_WAIT_S = 60.0


@dataclass(frozen=True)
class Pending:
    """A delivery owed: the event's bytes, whose it is, and where its retries stand."""

    webhook_id: str
    owner: str
    type: str
    body: str
    since: float  # when the event was queued (time.time())
    attempts: int = 0
    next_at: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, value: bytes) -> Pending:
        return cls(**json.loads(value))


class DeliveryLog(Protocol):
    """Where delivery state lives (:class:`~.relay.KafkaDeliveryLog`; a dict in tests)."""

    def load(self) -> list[Pending]: ...
    def put(self, pending: Pending) -> None: ...
    def done(self, webhook_id: str) -> None: ...


class Send(Protocol):
    def __call__(self, url: str, headers: Mapping[str, str], body: bytes) -> Outcome: ...


def delay_s(api: ApiConfig, attempts: int, rng: Callable[[], float] = random.random) -> float:
    """How long to wait after the ``attempts``-th failed attempt."""
    step = min(api.webhook_backoff_max_s, api.webhook_backoff_s * 2.0 ** min(attempts - 1, 62))
    return float(step / 2 + rng() * step / 2)


class Deliverer:
    def __init__(
        self,
        api: ApiConfig,
        endpoints: Mapping[str, Endpoint],
        send: Send,
        store: DeliveryLog,
        metrics: WebhookMetrics,
    ) -> None:
        self._api = api
        self._endpoints = endpoints
        self._send = send
        self._store = store
        self._metrics = metrics
        self._owed: dict[str, Pending] = {}
        self._due: list[tuple[float, str]] = []  # (next_at, webhook_id), a heap
        self._in_flight: set[str] = set()
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(_SENDERS, thread_name_prefix="api-webhook")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.release()
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(10)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- ownership ----------------------------------------------------------------------

    def take(self, pending: Iterable[Pending]) -> None:
        with self._cond:
            for item in pending:
                self._owed[item.webhook_id] = item
                heapq.heappush(self._due, (item.next_at, item.webhook_id))
            self._cond.notify_all()

    def resume(self) -> None:
        """This replica now delivers: everything owed on Kafka is its to send."""
        self.take(self._store.load())

    def release(self) -> None:
        """Another replica delivers from now on: forget what is owed, once the attempts in
        flight have ended (bounded by their timeout)."""
        deadline = time.monotonic() + _RELEASE_WAIT_S
        with self._cond:
            self._owed.clear()
            self._due.clear()
            while self._in_flight and time.monotonic() < deadline:
                self._cond.wait(0.1)

    def oldest_age_s(self, now: float) -> float:
        with self._cond:
            return max((now - p.since for p in self._owed.values()), default=0.0)

    # -- the schedule -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                now = time.time()
                due: list[Pending] = []
                while self._due and self._due[0][0] <= now:
                    _, webhook_id = heapq.heappop(self._due)
                    item = self._owed.get(webhook_id)
                    if item is not None and webhook_id not in self._in_flight:
                        self._in_flight.add(webhook_id)
                        due.append(item)
                wait = min(self._due[0][0] - now, 1.0) if self._due else 1.0
                if not due:
                    self._cond.wait(max(wait, 0.01))
            for item in due:
                self._pool.submit(self._attempt, item)

    def _attempt(self, item: Pending) -> None:
        try:
            try:
                outcome = self._try(item)
            except Exception as exc:  # whatever the receiver provoked: a failed attempt,
                # with back-off and give-up like any other, never a loop at a fixed pace
                log.exception("webhook %s: the attempt raised", item.webhook_id)
                outcome = Outcome("failed", type(exc).__name__)
            self._settle(item, outcome)
        except Exception as exc:  # Kafka failing on the record, say: retried in a while
            log.warning("webhook %s: %r; retrying", item.webhook_id, exc)
            self._reschedule(item, time.time() + self._api.webhook_backoff_s)
        finally:
            with self._cond:
                self._in_flight.discard(item.webhook_id)
                self._cond.notify_all()

    def _try(self, item: Pending) -> Outcome:
        endpoint = self._endpoints.get(item.owner)
        if endpoint is None or item.type not in endpoint.events:
            return Outcome("refused", "the key has no endpoint for this event any more")
        body = item.body.encode()
        headers = signed_headers(endpoint.key, item.webhook_id, int(time.time()), body)
        return self._send(endpoint.url, headers, body)

    def _settle(self, item: Pending, outcome: Outcome) -> None:
        now = time.time()
        attempts = item.attempts + 1
        if outcome.kind == "delivered":
            self._finish(item, "delivered")
            return
        if outcome.kind == "refused" or now - item.since >= self._api.webhook_give_up_after_s:
            kind = "refused" if outcome.kind == "refused" else "gave_up"
            log.warning(
                "webhook %s of %s (%s) %s after %d attempts: %s",
                item.webhook_id, item.owner, item.type, kind, attempts, outcome.detail,
            )  # fmt: skip
            self._finish(item, kind)
            return
        self._metrics.attempt("failed")
        later = replace(item, attempts=attempts, next_at=now + delay_s(self._api, attempts))
        log.info(
            "webhook %s of %s: attempt %d failed (%s); next in %.0fs",
            item.webhook_id, item.owner, attempts, outcome.detail, later.next_at - now,
        )  # fmt: skip
        self._store.put(later)
        self._reschedule(later, later.next_at)

    def _finish(self, item: Pending, outcome: str) -> None:
        self._store.done(item.webhook_id)
        self._metrics.attempt(outcome)
        with self._cond:
            self._owed.pop(item.webhook_id, None)

    def _reschedule(self, item: Pending, at: float) -> None:
        with self._cond:
            if item.webhook_id in self._owed:  # not released meanwhile
                self._owed[item.webhook_id] = item
                heapq.heappush(self._due, (at, item.webhook_id))
                self._cond.notify_all()
