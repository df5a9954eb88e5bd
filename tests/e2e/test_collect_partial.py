"""``batchpipe collect ID --partial`` as a user types it: the answers of a running batch so
far, exit 0, and every line of them among the batch's final answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import run, wait_until, worker, write_config

pytestmark = pytest.mark.e2e

LINES = 60


def requests(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"hello {i}"}]},
        }
        for i in range(LINES)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def answered(config: Path, batch_id: str) -> int:
    done = run("status", batch_id, "--json", "-c", str(config), timeout=60)
    counts = json.loads(done.stdout)["request_counts"] if done.returncode == 0 else {}
    return int(counts.get("completed", 0)) + int(counts.get("failed", 0))


def test_partial_writes_what_is_answered_now_and_exits_0(tmp_path: Path, broker: str) -> None:
    # two requests an engine batch, ~0.4 s each: 60 lines take about 12 s
    config = write_config(
        tmp_path,
        broker,
        {"kind": "echo", "simulated_token_s": 0.05},
        batching={"max_batch_size": 2, "adaptive": False},
    )
    with worker(config):
        batch_id = run("submit", str(requests(tmp_path)), "-c", str(config)).stdout.strip()
        assert batch_id.startswith("batch_")
        wait_until(lambda: answered(config, batch_id) >= 2, 120, "two answers")
        out, errors = tmp_path / "partial.jsonl", tmp_path / "partial-errors.jsonl"
        partial = run(
            "collect", batch_id, "--partial", "-o", str(out), "--errors", str(errors),
            "-c", str(config), timeout=120,
        )  # fmt: skip
        assert partial.returncode == 0, partial.stderr
        assert f"of {LINES} answered so far" in partial.stderr
        so_far = out.read_text().splitlines()
        ids = [json.loads(line)["custom_id"] for line in so_far]
        assert 2 <= len(ids) < LINES and len(set(ids)) == len(ids), ids
        assert errors.read_text() == ""

        final = tmp_path / "final.jsonl"
        done = run(
            "collect", batch_id, "-o", str(final), "--errors", str(tmp_path / "e.jsonl"),
            "--timeout", "120", "-c", str(config), timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        every = final.read_text().splitlines()
        assert len(every) == LINES and set(so_far) <= set(every)


def test_collect_help_explains_partial_and_following() -> None:
    done = run("collect", "--help", timeout=60)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--partial writes only what is answered now and exits 0" in text
    assert "each line is written as it lands" in text
