"""``batchpipe run FILE -o OUT`` (submit, follow, collect in one command) and ``batchpipe
list`` (the fleet's batches, newest first), as a user types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import echo_examples, run, worker, write_config

pytestmark = pytest.mark.e2e


def test_run_writes_every_answer_and_list_shows_the_batches_newest_first(
    tmp_path: Path, broker: str
) -> None:
    config = write_config(tmp_path, broker, {"kind": "echo"})
    requests = echo_examples(tmp_path)
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    with worker(config):
        done = run(
            "run", str(requests), "-o", str(out), "--errors", str(errors), "--timeout", "240",
            "-c", str(config),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        first = done.stdout.strip()
        assert first.startswith("batch_")
        assert f"{first}: 8 completed" in done.stderr
        ids = sorted(json.loads(line)["custom_id"] for line in out.read_text().splitlines())
        assert len(set(ids)) == 8 and errors.read_text() == ""

        second = run("submit", str(requests), "-c", str(config)).stdout.strip()
        listed = run("list", "-c", str(config))
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert [line.split()[0] for line in lines] == [second, first]  # newest first
        assert "completed" in lines[1] and "8/8 answered" in lines[1]

        as_json = run("list", "--json", "--limit", "1", "-c", str(config))
        doc = json.loads(as_json.stdout)
        assert [b["id"] for b in doc["data"]] == [second] and doc["has_more"] is True
        assert doc["data"][0]["request_counts"]["total"] == 8


@pytest.mark.parametrize("command", ["run", "list"])
def test_run_and_list_explain_themselves(command: str) -> None:
    done = run(command, "--help", timeout=60)
    assert done.returncode == 0
    assert "newest first" in done.stdout or "-o" in done.stdout
