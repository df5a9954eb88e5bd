"""The remote server's failures are logged at once, then at most once per EVERY_S."""

from __future__ import annotations

import logging

import pytest

from worker.engines.remote.failures import EVERY_S, FailureLog


def test_failures_are_logged_at_once_then_rate_limited_and_the_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    failures = FailureLog("http://vllm:8000/v1", clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="batchpipe.remote")
    failures.failed("connection", "connection failed: refused", given_up=False)
    assert len(caplog.records) == 1
    assert "http://vllm:8000/v1" in caplog.records[0].getMessage()
    assert "connection failed: refused" in caplog.records[0].getMessage()
    for _ in range(133):
        failures.failed("connection", "connection failed: refused", given_up=True)
    assert len(caplog.records) == 1  # within EVERY_S: counted, not logged
    now[0] += EVERY_S
    failures.failed("http_5xx", "HTTP 500: down", given_up=True)
    message = caplog.records[-1].getMessage()
    assert len(caplog.records) == 2
    assert "134 failed attempts (133 connection, 1 http_5xx), 134 requests given up" in message
    failures.answered()
    failures.answered()
    assert len(caplog.records) == 3 and "answers again" in caplog.records[-1].getMessage()
