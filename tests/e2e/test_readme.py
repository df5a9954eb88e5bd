"""README.md as a newcomer follows it: every shell block runs as written, in bash, against
an embedded broker, and so does the SDK snippet with examples/requests.jsonl.

What the test adds around a block is harness, never a change to it: the environment a
user's machine would have (a stand-in OpenAI-compatible server of the example's model in
place of loading SmolLM2, so the journeys run in seconds; metrics on a free port, since
other workers share this host), a wait for ``serve`` to answer before the snippet runs,
and stopping the block's background jobs at the end. The quick start's ``make demo`` runs
in tests/e2e/test_cli_e2e.py (with the real model) and ``make test`` is the suite itself;
the Helm values are rendered by the chart and loaded by the worker's own loader.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from bench.openai_standin import StandIn
from tests.deploy.test_helm import CHART, _load_worker_config, _render
from tests.e2e.cli import EXAMPLES, ROOT, clean_env
from worker.kafka.broker import EmbeddedBroker

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
MODEL = "smollm2-135m-instruct"  # the default model, which the example names
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: blocks run elsewhere, by their first line
ELSEWHERE = {"make demo": "tests/e2e/test_cli_e2e.py and the suite itself (make test)"}


def blocks(language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(README.read_text()) if lang == language]


def shell_blocks() -> dict[str, str]:
    """The README's shell blocks by their section's title."""
    text = README.read_text()
    found: dict[str, str] = {}
    for match in _FENCE.finditer(text):
        if match.group(1) != "sh" or match.group(2).startswith(tuple(ELSEWHERE)):
            continue
        title = re.findall(r"^## (.+)$", text[: match.start()], re.MULTILINE)[-1]
        found[title] = match.group(2)
    return found


@pytest.fixture
def server() -> Iterator[StandIn]:
    standin = StandIn(model=MODEL, token_s=0.001, max_running=8).start()
    yield standin
    standin.stop()


@pytest.fixture
def broker() -> Iterator[str]:
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user's directory with the repository's example in it."""
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES, tmp_path / "examples" / "requests.jsonl")
    return tmp_path


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` under ``set -euo pipefail``; its background jobs stopped at the end."""
    harness = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\n"
    return subprocess.run(
        ["bash", "-c", harness + script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


def user_env(home: Path, server: StandIn, **extra: str) -> dict[str, str]:
    """A user's environment: the batchpipe command on PATH, the stand-in as the model."""
    bin_dir = str(Path(sys.executable).parent)
    return clean_env(
        HOME=str(home),
        PATH=f"{bin_dir}:{clean_env()['PATH']}",
        BATCHPIPE_METRICS__PORT="0",
        BATCHPIPE_ENGINE__KIND="openai",
        BATCHPIPE_ENGINE__REMOTE__BASE_URL=server.base_url,
        BATCHPIPE_ENGINE__REMOTE__ALLOW_PRIVATE="true",
        **extra,
    )


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_every_shell_block_is_run_here() -> None:
    assert sorted(shell_blocks()) == sorted(
        [
            "From the command line",
            "With the OpenAI SDK",
            "A fleet in front of a server you already run",
        ]
    )
    assert len(blocks("python")) == 1


def test_the_command_line_journey(home: Path, server: StandIn) -> None:
    done = bash(shell_blocks()["From the command line"], home, user_env(home, server))
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines(home / "results.jsonl") == 8 and lines(home / "again.jsonl") == 8
    assert (home / "errors.jsonl").read_text() == ""
    listed = [line for line in done.stdout.splitlines() if line.startswith("batch_")]
    assert len([line for line in listed if "answered" in line]) == 2, done.stdout


def test_the_sdk_journey(home: Path, server: StandIn, broker: str) -> None:
    env = user_env(home, server, BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS=broker)
    [snippet] = blocks("python")
    (home / "snippet.py").write_text(snippet)
    ready = (
        "until curl -sf http://127.0.0.1:8000/readyz >/dev/null; do sleep 0.2; done\n"
        f"{sys.executable} snippet.py\n"
    )
    worker = "batchpipe worker &\n"  # the fleet serve publishes to
    done = bash(worker + shell_blocks()["With the OpenAI SDK"] + ready, home, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"['{MODEL}']" in done.stdout or "[]" in done.stdout  # the models list printed
    outputs = [line for line in done.stdout.splitlines() if line.startswith('{"id"')]
    assert len(outputs) == 8, done.stdout
    assert not list(home.glob("batchpipe-files"))


def test_the_fleet_in_front_of_a_server(home: Path, server: StandIn, broker: str) -> None:
    env = user_env(
        home,
        server,
        BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS=broker,
        SERVER_URL=server.base_url,
        SERVER_MODEL=MODEL,
    )
    del env["BATCHPIPE_ENGINE__KIND"], env["BATCHPIPE_ENGINE__REMOTE__BASE_URL"]
    del env["BATCHPIPE_ENGINE__REMOTE__ALLOW_PRIVATE"]  # the block sets all three
    done = bash(shell_blocks()["A fleet in front of a server you already run"], home, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines(home / "served.jsonl") == 8
    assert server.authorization == "Bearer sk-your-server-key"


def test_the_helm_values_render_into_a_configuration_the_worker_loads(tmp_path: Path) -> None:
    [values] = blocks("yaml")
    with helm.Chart.load(CHART) as chart:
        docs = _render(chart, yaml.safe_load(values))
    config = _load_worker_config(docs, tmp_path)
    assert (config.engine.kind, config.engine.model) == ("vllm", "/models/my-model")
    assert config.kafka.bootstrap_servers == "my-cluster-kafka-bootstrap.kafka.svc:9092"
