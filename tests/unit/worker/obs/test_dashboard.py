"""The Grafana dashboard is well formed and queries only metrics WorkerMetrics exposes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchpipe.api.keymetrics import key_exposition
from tests import ROOT
from worker.obs.metrics import WorkerMetrics

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "batchpipe.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queried_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def exposed_series_names() -> set[str]:
    """Names a PromQL query can select: counters with _total, histograms by their parts."""
    metrics = WorkerMetrics(model="m", engine="echo", version="0", prefetch_limit=1)
    # the API server's per-key series (batchpipe serve) are on the dashboard too
    text = metrics.render() + key_exposition(["alice"], [], lambda b: (b.counts, b.usage))
    names = set()
    for family in text_string_to_metric_families(text.decode()):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ())}
    return names


def test_dashboard_identity_and_variables(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "batchpipe"
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["price_per_1k"]["type"] in {"textbox", "constant"}
    assert variables["price_per_1k"]["query"] == "0.06"


def test_panels_have_unique_ids_and_fit_the_grid_without_overlap(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        area = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not area & cells, f"panel {p['title']!r} overlaps another"
        cells |= area


def test_every_panel_queries_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    panels = queried_panels(dashboard)
    assert len(panels) >= 15
    for p in panels:
        assert p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            expr = t["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]")


def test_expressions_reference_only_exposed_metrics(dashboard: dict[str, Any]) -> None:
    exposed = exposed_series_names()
    exprs = [t["expr"] for p in queried_panels(dashboard) for t in p["targets"]]
    referenced = {name for e in exprs for name in re.findall(r"\bbatchpipe_[a-z0-9_]+", e)}
    assert referenced <= exposed, referenced - exposed
    # the headline series the issue asks for are all on the dashboard
    for wanted in (
        "batchpipe_requests_total",
        "batchpipe_tokens_total",
        "batchpipe_request_latency_seconds_bucket",
        "batchpipe_queue_wait_seconds_bucket",
        "batchpipe_engine_batch_seconds_bucket",
        "batchpipe_engine_request_seconds_bucket",
        "batchpipe_engine_sequences",
        "batchpipe_batch_fill_ratio_sum",
        "batchpipe_batch_token_fill_ratio_sum",
        "batchpipe_consumer_lag",
        "batchpipe_consumer_lag_unknown_partitions",
        "batchpipe_request_errors_total",
        "batchpipe_dead_letters_total",
        "batchpipe_transactions_total",
        "batchpipe_stage_seconds_total",
        "batchpipe_engine_utilization",
        "batchpipe_adaptive_batch_size",
        "batchpipe_inflight_requests",
        "batchpipe_prefetch_limit",
    ):
        assert wanted in referenced, wanted
    assert any("$price_per_1k" in e and "batchpipe_tokens_total" in e for e in exprs)


def test_a_misspelt_metric_would_be_caught() -> None:
    exposed = exposed_series_names()
    assert "batchpipe_request_latency_seconds" not in exposed  # a histogram needs a suffix
    assert "batchpipe_requests" not in exposed  # a counter is selected with _total
    assert "batchpipe_consumer_lag" in exposed  # known even before any partition is assigned
