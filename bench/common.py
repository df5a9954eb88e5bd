"""Shared pieces of the benchmarks: a broker, a worker on a thread, results to JSON."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.integration.harness import isolated_config, running_worker
from worker.config import Config

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
