"""The feeder thread survives what goes wrong inside it: it leaves the group and joins again
(worker/feeder/feeder.py), so a fleet never stops feeding for good."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from worker.config import Config
from worker.feeder import feeder as feeder_module
from worker.feeder.feeder import Feeder


def test_a_failure_inside_the_feeder_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []
    done = threading.Event()

    def failing_serve(self: Feeder) -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ValueError("a bug")
        done.set()
        self._stop.set()

    monkeypatch.setattr(Feeder, "_serve", failing_serve)
    monkeypatch.setattr(feeder_module, "RETRY_S", 0.01)
    feeder = Feeder(Config(), CollectorRegistry())
    feeder._thread.start()  # start() would create topics on a broker
    assert done.wait(5), f"gave up after {len(attempts)} attempts"
    feeder.stop()
    assert len(attempts) == 3
