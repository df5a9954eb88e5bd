"""Items 2 and 13 of issue 41 through ``batchpipe serve``, as a user starts it: the
example batch uploaded with the official SDK completes, ``serve`` leaves no folder in
the directory it runs from and exits 0 on SIGTERM, and ``retry`` without a key says how
to give one."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from bench.openai_standin import StandIn
from tests.e2e.cli import (
    EXAMPLES,
    ROOT,
    clean_env,
    run,
    serving,
    wait_until,
    worker,
    write_config,
)
from tests.integration.fleet import free_port
from tests.openai_sdk import sdk_line

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"  # the example's model, served by the stand-in
KEY = "sk-e2e-serve"
WAIT_S = 240.0  # a bound, not a pace


@dataclass(frozen=True)
class Fleet:
    config: Path
    url: str
    cwd: Path
    env: dict[str, str]
    serve: subprocess.Popen[str]


@pytest.fixture(scope="module")
def fleet(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A stand-in server of the example's model, a worker in front of it and ``serve``."""
    tmp = tmp_path_factory.mktemp("serve")
    standin = StandIn(model=MODEL, token_s=0.001, max_running=8).start()
    engine = {
        "kind": "openai",
        "model": MODEL,
        "remote": {"base_url": standin.base_url, "allow_private": True},
    }
    port = free_port()
    config = write_config(tmp, broker, engine, api={"port": port, "poll_interval_ms": 200})
    cwd = tmp / "cwd"
    cwd.mkdir()
    env = clean_env(BATCHPIPE_API_KEYS=KEY, HOME=str(tmp / "home"))
    try:
        with serving(config, port, env, cwd) as serve, worker(config, env=env):
            yield Fleet(config, f"http://127.0.0.1:{port}", cwd, env, serve)
    finally:
        standin.stop()


def test_the_example_batch_completes_through_serve_with_the_sdk(fleet: Fleet) -> None:
    client = OpenAI(base_url=f"{fleet.url}/v1", api_key=KEY)
    file = client.files.create(file=EXAMPLES.open("rb"), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    ended = ("completed", "failed", "expired", "cancelled")
    wait_until(lambda: client.batches.retrieve(batch.id).status in ended, WAIT_S, "batch ended")
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch.errors
    assert batch.request_counts is not None and batch.request_counts.completed == 8
    assert batch.output_file_id is not None
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert len(lines) == 8 and all(sdk_line(line) is not None for line in lines)


def test_retry_without_a_key_says_how_to_give_one(fleet: Fleet) -> None:
    env = {k: v for k, v in fleet.env.items() if k != "OPENAI_API_KEY"}
    done = run("retry", "batch_nope", "-c", str(fleet.config), env=env, timeout=60)
    assert done.returncode == 1
    assert "401" in done.stderr
    assert "--api-key" in done.stderr and "OPENAI_API_KEY" in done.stderr


def test_serve_leaves_no_folder_in_its_directory_and_exits_0_on_sigterm(fleet: Fleet) -> None:
    assert list(fleet.cwd.iterdir()) == []  # the files went under HOME, not the cwd
    fleet.serve.send_signal(signal.SIGTERM)
    assert fleet.serve.wait(60) == 0  # as the worker does after a clean shutdown


def test_help_lists_every_exit_code() -> None:
    done = run("--help", timeout=60)
    for code in ("0 ok", "1 Kafka", "2 bad", "3 model", "4 worker wedged", "124", "130"):
        assert code in done.stdout.replace("\n", " ")


def test_the_documented_metrics_host_is_the_configured_one() -> None:
    section = (ROOT / "docs" / "architecture.md").read_text().split("## 6.")[1].split("## 7.")[0]
    [row] = [line for line in section.splitlines() if line.startswith("| `metrics`")]
    assert "`host` (127.0.0.1" in row
