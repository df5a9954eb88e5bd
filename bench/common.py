"""Shared pieces of the benchmarks: a broker, a worker on a thread, results to JSON."""

from __future__ import annotations

import json
import platform
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.integration.harness import isolated_config, running_worker
from worker.config import Config
from worker.feeder.demand import DemandWriter

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path


def fresh_config(bootstrap: str, **batching: Any) -> Config:
    """A config with topics and group of its own on ``bootstrap``."""
    config = isolated_config(bootstrap, prefix="bench")
    return replace(
        config,
        batching=replace(config.batching, **batching),
        metrics=replace(config.metrics, host="127.0.0.1", port=0),
    )


worker_thread = running_worker


class DemandStandin:
    """Demand reports for every partition of the requests topic on behalf of readers that
    are not batchpipe workers (a feeder benchmarked or tested alone, §10): credit for
    about ``free`` records in all, as if nothing were ever read. A feeder feeds only
    workers that report; without this it would feed nothing."""

    def __init__(self, config: Config, free: int, partitions: int | None = None) -> None:
        self._kafka = config.kafka
        self._free = free
        self._partitions = config.kafka.partitions if partitions is None else partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demand-standin", daemon=True)

    def __enter__(self) -> DemandStandin:
        self._writer = DemandWriter(self._kafka, "bench-standin")
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._writer.close()

    def _run(self) -> None:
        positions = {p: 0 for p in range(self._partitions)}
        while True:
            self._writer.report(time.monotonic(), positions, 0, 0, self._free)
            if self._stop.wait(0.5):
                return
