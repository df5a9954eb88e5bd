"""Health state and the one-port HTTP server (/metrics, /healthz, /readyz) on 127.0.0.1."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.config import MetricsConfig
from worker.obs.health import Health, MetricsServer
from worker.obs.metrics import WorkerMetrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(url: str, accept: str = "") -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


@pytest.fixture
def metrics() -> WorkerMetrics:
    return WorkerMetrics(model="echo", engine="echo", version="0.1.0", prefetch_limit=16)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def health(metrics: WorkerMetrics, clock: FakeClock) -> Health:
    return Health(liveness_timeout_s=60.0, metrics=metrics, clock=clock)


@pytest.fixture
def server(metrics: WorkerMetrics, health: Health) -> Iterator[MetricsServer]:
    srv = MetricsServer(MetricsConfig(host="127.0.0.1", port=0), metrics, health)
    srv.start()
    yield srv
    srv.stop()


def ready_gauge(metrics: WorkerMetrics) -> float | None:
    return metrics.registry.get_sample_value("batchpipe_worker_ready")


def test_port_zero_binds_a_free_port(server: MetricsServer) -> None:
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_metrics_endpoint_serves_the_registry(
    server: MetricsServer, metrics: WorkerMetrics
) -> None:
    metrics.dedup_hit()
    status, content_type, body = get(server.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["batchpipe_dedup_hits"].samples[0].value == 1


def test_metrics_endpoint_speaks_openmetrics_when_asked(server: MetricsServer) -> None:
    status, content_type, body = get(server.url + "/metrics", "application/openmetrics-text")
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def healthz(server: MetricsServer) -> tuple[int, dict[str, object]]:
    status, content_type, body = get(server.url + "/healthz")
    assert content_type == "application/json"
    return status, json.loads(body)


def test_healthz_fails_until_the_loop_runs_and_when_it_stops_progressing(
    server: MetricsServer, health: Health, clock: FakeClock
) -> None:
    # loading the model is not the loop: a startup probe covers it
    assert healthz(server) == (
        503,
        {"alive": False, "reason": "the worker loop has not started", "heartbeat_age_s": None},
    )
    health.beat()
    assert healthz(server) == (200, {"alive": True, "reason": "", "heartbeat_age_s": 0.0})
    clock.now += 61
    status, body = healthz(server)
    assert (status, body["alive"], body["heartbeat_age_s"]) == (503, False, 61.0)
    assert "liveness_timeout_s=60" in str(body["reason"])
    health.beat()
    assert healthz(server)[0] == 200


def test_healthz_fails_for_good_once_the_worker_is_wedged(
    server: MetricsServer, health: Health
) -> None:
    health.beat()
    health.wedge("engine call exceeded engine_timeout_s=600")
    health.beat()  # the loop still beats: it is not what liveness is about any more
    status, body = healthz(server)
    assert (status, body["alive"]) == (503, False)
    assert body["reason"] == "wedged: engine call exceeded engine_timeout_s=600"


def test_readyz_needs_model_consumer_and_producer(
    server: MetricsServer, health: Health, metrics: WorkerMetrics
) -> None:
    status, _, body = get(server.url + "/readyz")
    assert status == 503
    assert json.loads(body)["failing"] == ["model", "consumer", "producer"]
    assert ready_gauge(metrics) == 0

    health.set_consumer_ok(True)
    health.set_producer_ok(True)
    health.set_model_loaded(False, "5003: no such model 'gpt-9'")
    status, _, body = get(server.url + "/readyz")
    doc = json.loads(body)
    assert (status, doc["ready"], doc["failing"]) == (503, False, ["model"])
    assert doc["checks"]["model"] == {"ok": False, "reason": "5003: no such model 'gpt-9'"}
    assert doc["checks"]["producer"] == {"ok": True, "reason": ""}

    health.set_model_loaded(True)
    status, _, body = get(server.url + "/readyz")
    assert (status, json.loads(body)["failing"]) == (200, [])
    assert ready_gauge(metrics) == 1

    health.set_producer_ok(False, "broker down")
    assert get(server.url + "/readyz")[0] == 503
    assert ready_gauge(metrics) == 0


def test_unknown_path_is_404(server: MetricsServer) -> None:
    status, content_type, _ = get(server.url + "/admin")
    assert (status, content_type) == (404, "application/json")


def test_stop_releases_the_port(metrics: WorkerMetrics, health: Health) -> None:
    srv = MetricsServer(MetricsConfig(host="127.0.0.1", port=0), metrics, health)
    srv.start()
    url = srv.url
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=2)
    with pytest.raises(RuntimeError):
        _ = srv.port
