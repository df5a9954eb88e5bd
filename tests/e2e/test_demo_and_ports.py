"""Items 5 (the echo demo), 8 and 9 of issue 41 as a user runs them: ``batchpipe demo
--set engine.kind=echo`` from a directory outside the repository, and a second worker on
a host whose metrics port is taken."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e.cli import run

pytestmark = pytest.mark.e2e


def test_the_echo_demo_runs_from_any_directory_and_answers_every_line(tmp_path: Path) -> None:
    done = run("demo", "--set", "engine.kind=echo", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 completed, 0 failed of 8" in done.stdout
    assert "sent to it as 'echo'" in done.stdout  # the demo says what it did to the batch
    # the metrics URL is printed while the worker runs, before the results
    assert done.stdout.index("/metrics") < done.stdout.index("completed, 0 failed")
    assert (tmp_path / "demo-out" / "results.jsonl").exists()


def test_a_missing_batch_file_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    done = run("demo", "--requests", "nope.jsonl", "--set", "engine.kind=echo", cwd=tmp_path)
    assert done.returncode == 2
    assert "nope.jsonl" in done.stderr
    assert "broker" not in done.stdout  # nothing was started


def test_a_taken_metrics_port_is_named_with_the_way_out(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(
            "worker", "--set", "engine.kind=echo", "--set", f"metrics.port={port}", timeout=120
        )
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert "--set metrics.port=0" in done.stderr
