"""Logging setup (JSON and text lines with extra fields) and the periodic summary line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from worker.obs.logs import SummaryLogger, setup_logging
from worker.obs.metrics import MetricsSnapshot


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root")
def test_json_lines_carry_extra_fields() -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    log = logging.getLogger("batchpipe.test")
    log.info("batch %s done", "b-1", extra={"size": 8, "fill": 0.25, "partition": "3"})
    log.debug("not shown at info level")
    try:
        raise ValueError("bad input")
    except ValueError:
        log.exception("failed", extra={"custom_id": "req-7"})
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert {k: first[k] for k in ("level", "logger", "msg", "size", "fill", "partition")} == {
        "level": "info",
        "logger": "batchpipe.test",
        "msg": "batch b-1 done",
        "size": 8,
        "fill": 0.25,
        "partition": "3",
    }
    assert set(first) == {"ts", "level", "logger", "msg", "size", "fill", "partition"}
    assert lines[1]["custom_id"] == "req-7"
    assert "ValueError: bad input" in lines[1]["exc"]


@pytest.mark.usefixtures("restore_root")
def test_text_lines_append_extras_and_setup_replaces_itself() -> None:
    first, second = io.StringIO(), io.StringIO()
    setup_logging("debug", "text", stream=first)
    setup_logging("warning", "text", stream=second)
    log = logging.getLogger("batchpipe.test")
    log.warning("lag high", extra={"lag": 1200})
    log.info("dropped at warning level")
    assert first.getvalue() == ""
    (line,) = second.getvalue().splitlines()
    assert line.endswith("WARNING batchpipe.test: lag high lag=1200")


def snap(**changes: int) -> MetricsSnapshot:
    base = MetricsSnapshot(
        requests_completed=0,
        requests_failed=0,
        dead_letters=0,
        tokens_prompt=0,
        tokens_completion=0,
        tokens_reasoning=0,
        batches=0,
        batched_requests=0,
        fill_ratio_sum=0.0,
        token_fill_ratio_sum=0.0,
        total_lag=0,
        lag_unknown_partitions=0,
    )
    return replace(base, **changes)


def test_summary_rates_from_snapshot_differences(caplog: pytest.LogCaptureFixture) -> None:
    summary = SummaryLogger(logging.getLogger("batchpipe.summary"), interval_s=10.0)
    caplog.set_level(logging.INFO, logger="batchpipe.summary")
    start = snap(requests_completed=100, tokens_prompt=5000, batches=10, batched_requests=80)
    assert summary.maybe_log(0.0, lambda: start) is None  # baseline
    assert summary.maybe_log(5.0, lambda: snap(requests_completed=150)) is None  # too soon
    later = snap(
        requests_completed=280,
        requests_failed=20,
        tokens_prompt=9000,
        tokens_completion=2000,
        batches=30,
        batched_requests=280,
        total_lag=42,
    )
    result = summary.maybe_log(20.0, lambda: later)
    assert result is not None
    assert result.interval_s == 20.0
    assert result.requests_per_s == 10.0  # 200 requests in 20 s
    assert result.tokens_per_s == 300.0  # (4000 prompt + 2000 completion) / 20
    assert result.completion_tokens_per_s == 100.0
    assert result.mean_batch_size == 10.0  # 200 batched requests in 20 batches
    assert result.lag == 42
    (record,) = caplog.records
    assert record.getMessage() == "summary: 10.0 req/s, 300.0 tokens/s, mean batch 10.0, lag 42"
    assert record.__dict__["requests_per_s"] == 10.0
    assert summary.maybe_log(25.0, lambda: later) is None  # next window starts at 20 s

    # a lag that could not be measured is said, not read as 0
    summary.maybe_log(40.0, lambda: replace(later, total_lag=0, lag_unknown_partitions=2))
    assert caplog.records[-1].getMessage().endswith("lag 0 + unknown on 2 partitions")


def test_a_snapshot_is_taken_only_when_a_summary_is_due() -> None:
    # a snapshot walks the whole registry: the loop asks every step, it is read rarely
    summary = SummaryLogger(logging.getLogger("batchpipe.summary"), interval_s=10.0)
    taken: list[float] = []

    def at(now: float) -> None:
        def snapshot() -> MetricsSnapshot:
            taken.append(now)
            return snap(requests_completed=int(now))

        summary.maybe_log(now, snapshot)

    for now in (0.0, 1.0, 2.0, 9.9, 10.0, 15.0, 20.5):
        at(now)
    assert taken == [0.0, 10.0, 20.5]  # the baseline, then once per interval


def test_fields_a_record_factory_adds_are_not_extras() -> None:
    # vLLM, once imported, makes every record carry vllm_process_name this way
    plain = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = plain(*args, **kwargs)
        record.library_field = "main"
        return record

    logging.setLogRecordFactory(factory)
    try:
        out = io.StringIO()
        setup_logging("info", "json", stream=out)
        logging.getLogger("batchpipe.test").info("done", extra={"size": 8})
    finally:
        logging.setLogRecordFactory(plain)
    line = json.loads(out.getvalue())
    assert set(line) == {"ts", "level", "logger", "msg", "size"}


def test_an_in_flight_engine_is_summarised_by_its_sequences_not_a_mean_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # an in-flight engine forms no batches: its summary read "mean batch 0.0" while it
    # served 330 requests/s (issue 48)
    summary = SummaryLogger(logging.getLogger("batchpipe.summary"), interval_s=10.0)
    caplog.set_level(logging.INFO, logger="batchpipe.summary")
    summary.maybe_log(0.0, lambda: snap())
    result = summary.maybe_log(10.0, lambda: snap(requests_completed=3300, engine_sequences=57))
    assert result is not None and result.sequences == 57
    assert caplog.records[-1].getMessage() == (
        "summary: 330.0 req/s, 0.0 tokens/s, 57 sequences in flight, lag 0"
    )
