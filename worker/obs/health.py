"""Liveness, readiness and the metrics endpoint of a worker, on one HTTP port.

``/metrics``  the worker's Prometheus registry (text format, or OpenMetrics when asked).
``/healthz``  liveness: 200 while the worker loop makes progress. 503 before the loop
              first ran (the model is loading: a startup probe covers that), once the
              last beat is older than ``worker.liveness_timeout_s`` (a stuck loop), and
              from the moment the worker is wedged (:meth:`Health.wedge`: a hung engine
              cannot be stopped from Python) — restart the process.
``/readyz``   readiness: 200 only when the model is loaded, the consumer is assigned or
              waiting for an assignment, and the producer is healthy; otherwise 503.
Both answer a JSON body saying why they fail.

Standard library only: a :class:`~http.server.ThreadingHTTPServer` in a daemon thread.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

from prometheus_client.exposition import choose_encoder

from worker.config import ConfigError, MetricsConfig
from worker.obs.metrics import WorkerMetrics

log = logging.getLogger(__name__)

CHECKS = ("model", "consumer", "producer")


@dataclass(frozen=True)
class Check:
    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class Liveness:
    alive: bool
    reason: str
    heartbeat_age_s: float | None  # None before the loop first ran


@dataclass(frozen=True)
class Readiness:
    checks: Mapping[str, Check]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks.values())

    @property
    def failing(self) -> tuple[str, ...]:
        return tuple(name for name, check in self.checks.items() if not check.ok)


class Health:
    """Thread-safe health state the worker sets and the HTTP server reads.

    Liveness starts failing and turns good at the loop's first :meth:`beat`, so loading a
    model never counts against ``liveness_timeout_s``. Each change of readiness is mirrored
    to ``batchpipe_worker_ready`` when ``metrics`` is given.
    """

    def __init__(
        self,
        liveness_timeout_s: float = 60.0,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.liveness_timeout_s = liveness_timeout_s
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._wedged = ""
        self._checks = {name: Check(False, f"{name} not reported yet") for name in CHECKS}
        if metrics is not None:
            metrics.set_ready(False)

    def beat(self) -> None:
        """Called once per iteration of the worker loop."""
        now = self._clock()
        with self._lock:
            self._last_beat = now

    def wedge(self, reason: str) -> None:
        """The worker can make no more progress (``reason`` says why): liveness fails from
        now on, whatever the loop does; only a new process recovers."""
        with self._lock:
            self._wedged = reason

    def liveness(self) -> Liveness:
        with self._lock:
            last_beat, wedged = self._last_beat, self._wedged
        if last_beat is None:
            return Liveness(False, "the worker loop has not started", None)
        age = self._clock() - last_beat
        if wedged:
            return Liveness(False, f"wedged: {wedged}", age)
        if age > self.liveness_timeout_s:
            reason = (
                f"the worker loop made no progress for {age:.1f} s "
                f"(worker.liveness_timeout_s={self.liveness_timeout_s:g})"
            )
            return Liveness(False, reason, age)
        return Liveness(True, "", age)

    def set_model_loaded(self, ok: bool, reason: str = "") -> None:
        self._set("model", ok, reason)

    def set_consumer_ok(self, ok: bool, reason: str = "") -> None:
        """True while partitions are assigned or the consumer waits for an assignment."""
        self._set("consumer", ok, reason)

    def set_producer_ok(self, ok: bool, reason: str = "") -> None:
        self._set("producer", ok, reason)

    def readiness(self) -> Readiness:
        with self._lock:
            return Readiness(MappingProxyType(dict(self._checks)))

    def _set(self, name: str, ok: bool, reason: str) -> None:
        with self._lock:
            self._checks[name] = Check(ok, "" if ok else reason or f"{name} not ok")
            ready = all(check.ok for check in self._checks.values())
            if self._metrics is not None:
                # under the lock, so the gauge cannot be left at an older state
                self._metrics.set_ready(ready)


class MetricsServer:
    """Serves /metrics, /healthz and /readyz. Port 0 picks a free port; see :attr:`port`."""

    def __init__(self, config: MetricsConfig, metrics: WorkerMetrics, health: Health) -> None:
        self._config = config
        self._metrics = metrics
        self._health = health
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        handler = type(
            "_BoundHandler", (_Handler,), {"metrics": self._metrics, "health": self._health}
        )
        server_cls = _IPv6Server if ":" in self._config.host else ThreadingHTTPServer
        host, port = self._config.host, self._config.port
        try:
            self._server = server_cls((host, port), handler)
        except OSError as exc:
            # a second worker on one host meets the first one's port: say which, and how out
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise ConfigError(
                f"metrics.port: cannot listen on {where} for /metrics, /healthz and /readyz: "
                f"{exc.strerror or exc} (another worker on this host?); --set metrics.port=0 "
                "picks a free port (the worker logs it), or choose another port"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},  # how quickly stop() returns
            name="batchpipe-metrics",
            daemon=True,
        )
        self._thread.start()
        log.info("metrics and health endpoints listening", extra={"url": self.url})

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = None
        self._thread = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("MetricsServer is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """A URL this host can reach the server at (a wildcard address becomes loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(
            self._config.host, self._config.host
        )
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    metrics: WorkerMetrics
    health: Health

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self.metrics.flush()  # what the loop gathered since its last step, too
            self._send(HTTPStatus.OK, encoder(self.metrics.registry), content_type)
        elif path == "/healthz":
            live = self.health.liveness()
            age = None if live.heartbeat_age_s is None else round(live.heartbeat_age_s, 3)
            body: dict[str, Any] = {
                "alive": live.alive,
                "reason": live.reason,
                "heartbeat_age_s": age,
            }
            self._json(HTTPStatus.OK if live.alive else HTTPStatus.SERVICE_UNAVAILABLE, body)
        elif path == "/readyz":
            readiness = self.health.readiness()
            checks = {n: {"ok": c.ok, "reason": c.reason} for n, c in readiness.checks.items()}
            body = {"ready": readiness.ready, "failing": list(readiness.failing), "checks": checks}
            self._json(HTTPStatus.OK if readiness.ready else HTTPStatus.SERVICE_UNAVAILABLE, body)
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such path: {path}"})

    def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        # scrapes and probes arrive every few seconds: debug level, not stderr
        log.debug("%s " + format, self.address_string(), *args)
