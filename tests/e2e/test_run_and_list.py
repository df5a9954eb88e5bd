"""``batchpipe run FILE -o OUT`` (submit, follow, collect in one command) and ``batchpipe
list`` (the fleet's batches, newest first), as a user types them."""

from __future__ import annotations

import json
import select
import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli import BATCHPIPE, clean_env, echo_examples, run, worker, write_config

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
        assert doc["first_id"] == doc["last_id"] == second  # the SDK's cursor page
        assert isinstance(doc["data"][0]["created_at"], int)  # OpenAI's whole seconds
        assert doc["data"][0]["request_counts"]["total"] == 8


@pytest.mark.parametrize("command", ["run", "list"])
def test_run_and_list_explain_themselves(command: str) -> None:
    done = run(command, "--help", timeout=60)
    assert done.returncode == 0
    assert "newest first" in done.stdout or "-o" in done.stdout


def test_ctrl_c_stops_run_following_and_says_the_batch_goes_on(tmp_path: Path, broker: str) -> None:
    config = write_config(tmp_path, broker, {"kind": "echo"})  # no worker: it never ends
    requests = echo_examples(tmp_path)
    follow = subprocess.Popen(
        [*BATCHPIPE, "run", str(requests), "-o", str(tmp_path / "out.jsonl"), "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    try:
        assert follow.stdout is not None
        readable, _, _ = select.select([follow.stdout], [], [], 240)
        assert readable, "run printed no batch id"
        batch_id = follow.stdout.readline().strip()
        assert batch_id.startswith("batch_")
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 130, err
    assert f"batchpipe collect {batch_id}" in err and "Traceback" not in err, err
