"""Running the ``batchpipe`` command as a user types it, in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests import ROOT

__all__ = [
    "BATCHPIPE",
    "EXAMPLES",
    "ROOT",
    "echo_examples",
    "run",
    "wait_until",
    "worker",
    "write_config",
]

EXAMPLES = ROOT / "examples" / "requests.jsonl"
BATCHPIPE = [sys.executable, "-m", "batchpipe.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its ``BATCHPIPE_*`` variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHPIPE_")}
    return env | extra


def run(
    *args: str,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """``batchpipe ARGS…`` to its end: exit code, stdout and stderr."""
    return subprocess.run(
        [*BATCHPIPE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(env) if env is not None else clean_env(),
    )


def write_config(
    tmp_path: Path, bootstrap: str, engine: Mapping[str, Any], **sections: Any
) -> Path:
    """A worker.yaml with topics and a group of its own (tests never see each other's)."""
    suffix = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": f"e2e-{suffix}",
            "requests_topic": f"e2e-requests-{suffix}",
            "results_topic": f"e2e-results-{suffix}",
            "dead_letter_topic": f"e2e-dead-{suffix}",
            "control_topic": f"e2e-control-{suffix}",
            "state_topic": f"e2e-state-{suffix}",
            "partitions": 3,
        },
        "engine": dict(engine),
        "metrics": {"host": "127.0.0.1", "port": 0},
        **sections,
    }
    path = tmp_path / f"worker-{suffix}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def echo_examples(tmp_path: Path) -> Path:
    """The example batch addressed to the echo engine (the worker's model, by omission)."""
    rows = [json.loads(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
    for row in rows:
        row["body"].pop("model")
    path = tmp_path / "echo-requests.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Ask ``done()`` every 0.2 s until it is true; fail after ``timeout_s`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.2)


@contextmanager
def worker(
    config: Path, env: Mapping[str, str] | None = None, stderr: Any = None
) -> Iterator[subprocess.Popen[str]]:
    """``batchpipe worker -c CONFIG`` for the length of the block; SIGTERM at its end,
    which must exit 0."""
    process = subprocess.Popen(
        [*BATCHPIPE, "worker", "-c", str(config)],
        cwd=ROOT,
        env=dict(env) if env is not None else clean_env(),
        stderr=stderr,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, f"worker exited {code}"


@contextmanager
def serving(
    config: Path, port: int, env: Mapping[str, str], cwd: Path = ROOT
) -> Iterator[subprocess.Popen[str]]:
    """``batchpipe serve -c CONFIG`` (listening on ``port``, as the config says) once its
    /readyz answers 200; stopped at the end of the block unless the test stopped it."""
    process = subprocess.Popen(
        [*BATCHPIPE, "serve", "-c", str(config)], cwd=cwd, env=dict(env), text=True
    )

    def ready() -> bool:
        assert process.poll() is None, "serve exited"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 120, "serve ready")
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
