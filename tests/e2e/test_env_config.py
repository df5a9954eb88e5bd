"""Items 1 and 10 of issue 41: the environment as a user sets it.

``export BATCHPIPE_REMOTE_API_KEY=…`` (docs/deploy.md, ``worker --help``) and any other
``BATCHPIPE_`` variable that is not configuration must not break a command, and the key
must reach the remote server; a setting spelt with single underscores is refused naming
the variable and the spelling meant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.openai_standin import StandIn
from tests.e2e.cli import clean_env, run, worker, write_config

pytestmark = pytest.mark.e2e

MODEL = "served-model"


@pytest.fixture
def server() -> Iterator[StandIn]:
    standin = StandIn(model=MODEL, token_s=0.001, max_running=8).start()
    yield standin
    standin.stop()


def lines(n: int) -> str:
    return "".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                    "max_tokens": 4,
                },
            }
        )
        + "\n"
        for i in range(n)
    )


def test_the_documented_remote_key_and_stray_variables_break_no_command(
    tmp_path: Path, broker: str, server: StandIn
) -> None:
    engine = {
        "kind": "openai",
        "model": MODEL,
        "remote": {"base_url": server.base_url, "allow_private": True},
    }
    config = write_config(tmp_path, broker, engine)
    env = clean_env(
        BATCHPIPE_REMOTE_API_KEY="sk-remote-e2e",
        BATCHPIPE_CHAOS_REPORT=str(tmp_path / "chaos.json"),
        BATCHPIPE_WEBHOOK_SECRET="whsec_e2e",
    )
    batch = tmp_path / "batch.jsonl"
    batch.write_text(lines(3))
    out = tmp_path / "out.jsonl"
    with worker(config, env=env):
        submitted = run("submit", str(batch), "-c", str(config), env=env)
        assert submitted.returncode == 0, submitted.stderr
        batch_id = submitted.stdout.strip()
        collected = run(
            "collect", batch_id, "-o", str(out), "--timeout", "240", "-c", str(config),
            env=env, cwd=tmp_path,
        )  # fmt: skip
        assert collected.returncode == 0, collected.stderr
        status = run("status", batch_id, "-c", str(config), env=env)
        assert status.returncode == 0, status.stderr
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(a["custom_id"] for a in answers) == ["r0", "r1", "r2"]
    assert server.authorization == "Bearer sk-remote-e2e"  # the documented key was sent


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("BATCHPIPE_KAFKA_BOOTSTRAP_SERVERS", "BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS"),
        ("BATCHPIPE_METRICS_PORT", "BATCHPIPE_METRICS__PORT"),
        ("BATCHPIPE_KAFKA__BOOTSTRAP_SERVER", "bootstrap_servers"),
    ],
)
def test_a_misspelt_variable_is_named_with_the_spelling_meant(
    tmp_path: Path, variable: str, meant: str
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text(lines(1))
    done = run("submit", str(batch), env=clean_env(**{variable: "9"}), timeout=60)
    assert done.returncode == 2, done.stderr
    assert variable in done.stderr and meant in done.stderr
    assert "did you mean" in done.stderr


def test_a_bad_value_names_its_variable(tmp_path: Path) -> None:
    done = run("status", "batch_x", env=clean_env(BATCHPIPE_KAFKA__PARTITIONS="many"), timeout=60)
    assert done.returncode == 2, done.stderr
    assert "kafka.partitions" in done.stderr
    assert "BATCHPIPE_KAFKA__PARTITIONS" in done.stderr


def test_worker_help_documents_the_key_variable() -> None:
    done = run("worker", "--help", timeout=60)
    assert done.returncode == 0 and "BATCHPIPE_REMOTE_API_KEY" in done.stdout
