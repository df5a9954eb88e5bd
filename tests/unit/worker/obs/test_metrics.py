"""WorkerMetrics: exact values after a known sequence of events, bounded labels, docs coverage."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests import ROOT
from worker.errors import ErrorCode
from worker.obs.metrics import WorkerMetrics, observe_all

ALLOWED_LABELS = {"model", "status", "code", "kind", "stage", "topic", "partition", "outcome"}
ALLOWED_LABELS |= {"version", "engine", "le"}
FIXED_VALUES = {
    "status": {"completed", "failed"},
    "code": {str(int(c)) for c in ErrorCode},
    "kind": {"prompt", "completion", "reasoning", "assign", "revoke", "lost"},
    "stage": {"decode", "batch", "encode", "produce"},
    "outcome": {"commit", "abort"},
}


def make_metrics() -> WorkerMetrics:
    return WorkerMetrics(model="echo", engine="echo", version="0.1.0", prefetch_limit=64)


def samples(m: WorkerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: WorkerMetrics, name: str, **labels: str) -> float:
    return samples(m)[(name, frozenset(labels.items()))]


TOPIC = "batchpipe.requests"


def feed_known_sequence(m: WorkerMetrics) -> None:
    m.answered("completed", None, 100, 20, 5, e2e_s=0.3, queue_wait_s=0.01)
    m.answered("completed", None, 50, 10, 0, e2e_s=None, queue_wait_s=0.2)
    m.answered("failed", ErrorCode.OVER_LIMIT, 0, 0, 0, e2e_s=1.5, queue_wait_s=0.0)
    m.dead_lettered()
    m.batch_done(2, 300, 0.5, 0.3, 0.25, [0.05, 0.07], engine_s=0.4)
    m.batch_done(4, 900, 1.0, 0.9, 0.0, 0.1, engine_s=2.0)
    m.dedup_hit()
    m.transaction("commit")
    m.transaction("commit")
    m.transaction("abort")
    m.rebalance("assign")
    m.set_inflight(7)
    m.set_adaptive_size(38)
    m.set_utilization(0.75)
    m.set_paused(2)
    m.set_consumer_lag({(TOPIC, 0): 12, (TOPIC, 1): 30, (TOPIC, 2): None})


def test_counters_after_known_events() -> None:
    m = make_metrics()
    feed_known_sequence(m)
    assert value(m, "batchpipe_requests_total", model="echo", status="completed") == 2
    assert value(m, "batchpipe_requests_total", model="echo", status="failed") == 1
    assert value(m, "batchpipe_request_errors_total", code="4003") == 1
    assert value(m, "batchpipe_request_errors_total", code="4001") == 1  # the dead letter
    assert value(m, "batchpipe_request_errors_total", code="5000") == 0
    assert value(m, "batchpipe_dead_letters_total") == 1
    assert value(m, "batchpipe_tokens_total", model="echo", kind="prompt") == 150
    assert value(m, "batchpipe_tokens_total", model="echo", kind="completion") == 30
    assert value(m, "batchpipe_tokens_total", model="echo", kind="reasoning") == 5
    assert value(m, "batchpipe_dedup_hits_total") == 1
    assert value(m, "batchpipe_transactions_total", outcome="commit") == 2
    assert value(m, "batchpipe_transactions_total", outcome="abort") == 1
    assert value(m, "batchpipe_rebalances_total", kind="assign") == 1
    assert value(m, "batchpipe_rebalances_total", kind="lost") == 0


def test_histograms_count_and_sum() -> None:
    m = make_metrics()
    feed_known_sequence(m)
    assert value(m, "batchpipe_request_latency_seconds_count") == 2  # one had no submitted_at
    assert value(m, "batchpipe_request_latency_seconds_sum") == pytest.approx(1.8)
    assert value(m, "batchpipe_request_latency_seconds_bucket", le="0.5") == 1
    assert value(m, "batchpipe_request_latency_seconds_bucket", le="+Inf") == 2
    assert value(m, "batchpipe_queue_wait_seconds_count") == 3
    assert value(m, "batchpipe_queue_wait_seconds_sum") == pytest.approx(0.21)
    assert value(m, "batchpipe_batch_wait_seconds_count") == 3  # two waits, then one
    assert value(m, "batchpipe_batch_wait_seconds_sum") == pytest.approx(0.22)
    assert value(m, "batchpipe_engine_batch_seconds_sum") == pytest.approx(2.4)
    assert value(m, "batchpipe_batch_size_count") == 2
    assert value(m, "batchpipe_batch_size_sum") == 6
    assert value(m, "batchpipe_batch_size_bucket", le="2.0") == 1
    assert value(m, "batchpipe_batch_tokens_sum") == 1200
    assert value(m, "batchpipe_batch_fill_ratio_bucket", le="0.5") == 1
    assert value(m, "batchpipe_batch_fill_ratio_sum") == pytest.approx(1.5)
    assert value(m, "batchpipe_batch_token_fill_ratio_bucket", le="0.3") == 1
    assert value(m, "batchpipe_batch_token_fill_ratio_sum") == pytest.approx(1.2)
    assert value(m, "batchpipe_padding_waste_ratio_sum") == pytest.approx(0.25)


def test_latency_buckets_span_5ms_to_10min() -> None:
    m = make_metrics()
    les = [
        s.labels["le"]
        for family in text_string_to_metric_families(m.render().decode())
        if family.name == "batchpipe_request_latency_seconds"
        for s in family.samples
        if s.name.endswith("_bucket")
    ]
    assert les[0] == "0.005"
    assert les[-2:] == ["600.0", "+Inf"]
    assert 12 <= len(les) - 1 <= 18


def test_gauges_and_build_info() -> None:
    m = make_metrics()
    feed_known_sequence(m)
    assert value(m, "batchpipe_inflight_requests") == 7
    assert value(m, "batchpipe_prefetch_limit") == 64
    assert value(m, "batchpipe_adaptive_batch_size") == 38
    assert value(m, "batchpipe_engine_utilization") == 0.75
    assert value(m, "batchpipe_paused_partitions") == 2
    assert value(m, "batchpipe_worker_ready") == 0
    assert value(m, "batchpipe_build_info", version="0.1.0", engine="echo", model="echo") == 1


def test_consumer_lag_follows_the_latest_measurement_and_counts_unknown_partitions() -> None:
    m = make_metrics()
    m.set_consumer_lag({(TOPIC, 0): 12, (TOPIC, 1): 30, (TOPIC, 2): None})
    lags = {k: v for k, v in samples(m).items() if k[0] == "batchpipe_consumer_lag"}
    assert {dict(labels)["partition"]: v for (_, labels), v in lags.items()} == {"0": 12, "1": 30}
    assert value(m, "batchpipe_consumer_lag_unknown_partitions") == 1
    assert (m.snapshot().total_lag, m.snapshot().lag_unknown_partitions) == (42, 1)

    m.set_consumer_lag({(TOPIC, 1): 5})  # partitions 0 and 2 were revoked
    lags = {k: v for k, v in samples(m).items() if k[0] == "batchpipe_consumer_lag"}
    series = frozenset({("topic", TOPIC), ("partition", "1")})
    assert lags == {("batchpipe_consumer_lag", series): 5}
    assert value(m, "batchpipe_consumer_lag_unknown_partitions") == 0
    assert (m.snapshot().total_lag, m.snapshot().lag_unknown_partitions) == (5, 0)


def test_stage_adds_elapsed_time_even_when_the_body_raises() -> None:
    m = make_metrics()
    with m.stage("decode"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), m.stage("decode"):
        raise RuntimeError("boom")
    decode = value(m, "batchpipe_stage_seconds_total", stage="decode")
    assert 0.02 <= decode < 1.0
    assert value(m, "batchpipe_stage_seconds_total", stage="produce") == 0


def test_snapshot_headline_totals() -> None:
    m = make_metrics()
    feed_known_sequence(m)
    snap = m.snapshot()
    assert (snap.requests_completed, snap.requests_failed, snap.requests) == (2, 1, 3)
    assert (snap.tokens_prompt, snap.tokens_completion, snap.tokens_reasoning) == (150, 30, 5)
    assert (snap.batches, snap.mean_batch_size, snap.mean_fill_ratio) == (2, 3.0, 0.75)
    assert snap.mean_token_fill_ratio == pytest.approx(0.6)
    assert (snap.dead_letters, snap.total_lag) == (1, 42)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.answered("failed", 4242, 1, 1, 0, None, 0.0),
        lambda m: m.dead_lettered(4242),
        lambda m: m.set_utilization(1.5),
    ],
)
def test_values_outside_their_ranges_are_rejected(call: object) -> None:
    m = make_metrics()
    before = m.render()
    with pytest.raises(ValueError):
        call(m)  # type: ignore[operator]
    assert m.render() == before


def test_labels_are_bounded() -> None:
    m = make_metrics()
    feed_known_sequence(m)
    all_samples: list[Sample] = [
        s for f in text_string_to_metric_families(m.render().decode()) for s in f.samples
    ]
    assert all_samples
    for s in all_samples:
        assert s.name.startswith("batchpipe_"), s.name
        assert set(s.labels) <= ALLOWED_LABELS, s
        for label, allowed in FIXED_VALUES.items():
            if label in s.labels:
                assert s.labels[label] in allowed, s


def test_two_workers_in_one_process_do_not_collide() -> None:
    a, b = make_metrics(), make_metrics()
    a.dedup_hit()
    assert value(a, "batchpipe_dedup_hits_total") == 1
    assert value(b, "batchpipe_dedup_hits_total") == 0


def test_docs_list_every_metric() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(batchpipe_[a-z0-9_]+)", doc))
    m = make_metrics()
    m.set_consumer_lag({(TOPIC, 0): 1})
    exposed = set()
    for family in text_string_to_metric_families(m.render().decode()):
        if not family.name.endswith("_created"):  # prometheus_client's creation timestamps
            exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    assert exposed <= documented, exposed - documented


def test_observing_a_batch_of_values_at_once_counts_as_observing_each() -> None:
    values = [0.0, 0.005, 0.0051, 0.1, 0.1, 3.0, 1e9, -1.0]
    one, each = CollectorRegistry(), CollectorRegistry()
    buckets = (0.005, 0.1, 2.5)
    observe_all(Histogram("h", "h", buckets=buckets, registry=one), values)
    histogram = Histogram("h", "h", buckets=buckets, registry=each)
    for value in values:
        histogram.observe(value)

    def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
        (family,) = registry.collect()
        return [(s.name, s.labels, s.value) for s in family.samples if s.name != "h_created"]

    assert samples(one) == samples(each)


def test_answers_and_stages_reach_the_series_at_the_next_flush_each_counted() -> None:
    """Issue 42: answers and stage times are added once per loop step, not once each."""
    m = make_metrics()

    def raw(name: str, **labels: str) -> float:
        return m.registry.get_sample_value(name, labels) or 0.0

    for i in range(5):
        m.answered("completed", None, 10, 2, 1, e2e_s=0.02 * i, queue_wait_s=0.5)
    m.answered("failed", ErrorCode.OVER_LIMIT, 0, 0, 0, e2e_s=None, queue_wait_s=0.0)
    m.add_stage("decode", 0.25)
    with m.stage("encode"):
        pass
    completed = ("batchpipe_requests_total", {"model": "echo", "status": "completed"})
    assert raw(completed[0], **completed[1]) == 0  # gathered, not added yet
    m.flush()
    assert raw(completed[0], **completed[1]) == 5
    assert raw("batchpipe_requests_total", model="echo", status="failed") == 1
    assert raw("batchpipe_request_errors_total", code=str(int(ErrorCode.OVER_LIMIT))) == 1
    assert raw("batchpipe_tokens_total", model="echo", kind="prompt") == 50
    assert raw("batchpipe_tokens_total", model="echo", kind="reasoning") == 5
    assert raw("batchpipe_request_latency_seconds_count") == 5
    assert raw("batchpipe_request_latency_seconds_sum") == pytest.approx(0.2)
    assert raw("batchpipe_queue_wait_seconds_count") == 6
    assert raw("batchpipe_stage_seconds_total", stage="decode") == 0.25
    assert raw("batchpipe_stage_seconds_total", stage="encode") > 0
    m.flush()  # nothing gathered since: nothing added twice
    assert raw(completed[0], **completed[1]) == 5
    assert raw("batchpipe_queue_wait_seconds_count") == 6
