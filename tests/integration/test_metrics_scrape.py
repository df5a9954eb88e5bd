"""Known traffic through a worker, then its /metrics and /readyz as Prometheus sees them."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
from msgspec import structs
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import publish, publish_raw, read_results, read_topic
from worker.config import Config
from worker.engines.echo import EchoEngine
from worker.loop.service import Worker
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

pytestmark = pytest.mark.integration

ALLOWED_LABELS = {"model", "status", "code", "kind", "stage", "topic", "partition", "outcome"}
ALLOWED_LABELS |= {"version", "engine", "le"}
# the feeder's per-tier series: three values at most (batcher.tiers.TIERS)
ALLOWED_LABELS |= {"tier"}


class GatedEngine(EchoEngine):
    """An echo engine whose model "loads" only when the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def load(self) -> None:
        self.gate.wait(30)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_for_status(url: str, want: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while (got := status_of(url)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def server_url(worker: Worker, timeout_s: float = 10) -> str:
    """The worker's metrics URL, once its server has started."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return worker.server.url
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert set(s.labels) <= ALLOWED_LABELS, s
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


def scrape_until_lag_is_0(url: str, partitions: int, timeout_s: float = 30.0) -> Samples:
    """Scrape until every partition reports lag 0 (lag is measured every 5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(url, timeout=5) as response:
            found = samples(response.read().decode())
        lags = [v for (name, _), v in found.items() if name == "batchpipe_consumer_lag"]
        if len(lags) == partitions and not any(lags):
            assert value(found, "batchpipe_consumer_lag_unknown_partitions") == 0
            return found
        assert time.monotonic() < deadline, f"lag never reached 0: {lags}"
        time.sleep(0.2)


def test_metrics_count_exactly_the_traffic_sent(kafka_config: Config) -> None:
    config = replace(
        kafka_config,
        engine=replace(kafka_config.engine, kind="echo", model="echo"),
        metrics=replace(kafka_config.metrics, host="127.0.0.1", port=0),
        batching=replace(kafka_config.batching, max_batch_size=8, dedup=False),
    )
    good = [
        InferenceRequest(
            custom_id=f"ok-{i}",
            messages=(ChatMessage("user", f"count me {i}"),),
            sampling=SamplingParams(max_tokens=16, temperature=0.0),
            submitted_at=time.time(),
        )
        for i in range(40)
    ]
    wrong_model = [
        structs.replace(r, custom_id=f"bad-{i}", model="gpt-x") for i, r in enumerate(good[:3])
    ]
    publish(config, good + wrong_model)
    publish_raw(config, [(b"not a request", None), (b"\x00\x01", None)])

    engine = GatedEngine()
    worker = Worker(config, engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        url = server_url(worker)
        assert wait_for_status(url + "/readyz", 503) == 503
        # the model is loading: the loop has not run, so liveness waits (a startup probe's job)
        assert status_of(url + "/healthz") == 503
        engine.gate.set()
        assert wait_for_status(url + "/readyz", 200) == 200
        assert wait_for_status(url + "/healthz", 200) == 200
        results = read_results(config, 43)
        read_topic(config, config.kafka.dead_letter_topic, 2)
        found = scrape_until_lag_is_0(url + "/metrics", config.kafka.partitions)
    finally:
        worker.stop()
        thread.join(60)

    assert value(found, "batchpipe_requests_total", status="completed") == 40
    assert value(found, "batchpipe_requests_total", status="failed") == 3
    assert value(found, "batchpipe_request_errors_total", code="4002") == 3
    assert value(found, "batchpipe_request_errors_total", code="4001") == 2
    assert value(found, "batchpipe_dead_letters_total") == 2
    # every valid request ran in exactly one batch
    assert value(found, "batchpipe_batch_size_sum") == 40
    batches = value(found, "batchpipe_batch_size_count")
    assert batches == value(found, "batchpipe_engine_batch_seconds_count") >= 5
    completion = sum(r.usage.completion_tokens for r in results)
    assert value(found, "batchpipe_tokens_total", kind="completion") == completion
    assert value(found, "batchpipe_request_latency_seconds_count") == 43
