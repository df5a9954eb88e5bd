"""Shared pieces of the benchmarks: a broker, a worker on a thread, results to JSON."""

from __future__ import annotations

import json
import platform
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from worker.config import Config
from worker.engines.base import Engine
from worker.service import Worker

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
    suffix = uuid.uuid4().hex[:8]
    config = Config()
    kafka = replace(
        config.kafka,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{suffix}",
        requests_topic=f"bench-requests-{suffix}",
        results_topic=f"bench-results-{suffix}",
        dead_letter_topic=f"bench-dead-{suffix}",
        partitions=3,
    )
    return replace(
        config,
        kafka=kafka,
        batching=replace(config.batching, **batching),
        metrics=replace(config.metrics, host="127.0.0.1", port=0),
    )


@contextmanager
def worker_thread(config: Config, engine: Engine | None = None) -> Iterator[Worker]:
    worker = Worker(config, engine)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
