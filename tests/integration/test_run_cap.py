"""A cap on a batch followed without serve (issue 50): ``Client.run`` — the path of
``batchpipe run`` — on the session's broker with a real echo worker paced like a model.
A 2,000-line batch capped at 20 % of its tokens is stopped by the collector's ``capped``
stop: its output and error files hold every line once, the lines not run as 4008, and
its spend passes the cap by no more than serve's stated overshoot."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpipe import Client
from batchpipe.cli import main
from batchpipe.cli.outcome import EXIT_CAPPED
from tests.integration.api.test_cost_cap import STEP_S, STOP_S, STOPPED, _tokens
from tests.integration.api.test_sdk_echo import batch_file
from tests.integration.harness import running_worker, write_config
from worker.config import Config, EngineConfig

pytestmark = pytest.mark.integration

LINES = 2_000


@pytest.fixture
def config(kafka_config: Config) -> Config:
    """An echo worker paced like a model, a FIFO, a control topic of the test's own."""
    kafka = replace(kafka_config.kafka, control_topic=f"test-control-{uuid.uuid4().hex[:12]}")
    return replace(
        kafka_config,
        kafka=kafka,
        scheduling=replace(kafka_config.scheduling, fair=False),
        engine=EngineConfig(kind="echo", simulated_token_s=STEP_S),
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_client_run_capped_at_a_fifth_of_its_tokens_stops_within_the_bound(
    config: Config, tmp_path: Path
) -> None:
    per_line = [sum(_tokens(i)) for i in range(LINES)]
    cap = sum(per_line) // 5
    out, err = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    with running_worker(config):
        status = Client(config).run(
            batch_file(tmp_path / "in.jsonl", LINES), out, err, timeout_s=120, max_tokens=cap
        )
    output, errors = _lines(out), _lines(err)

    # every line once: what ran in the output, what did not in the error file, as 4008
    ids = [str(line["custom_id"]) for line in output + errors]
    assert len(ids) == len(set(ids)) == LINES
    assert {json.dumps(line["error"]) for line in errors} == {
        json.dumps({"code": "4008", "message": STOPPED, "param": None})
    }
    spent = sum(line["response"]["body"]["usage"]["total_tokens"] for line in output)
    assert status.prompt_tokens + status.completion_tokens == spent
    assert (status.completed, status.failed) == (len(output), len(errors))
    assert status.capped == (
        f"the batch reached its token cap of {cap:,} ({spent:,} tokens spent); the lines not "
        "run are in the error file with code 4008 batch_cap_reached"
    )
    # the overshoot: serve's bound (tests/integration/api/test_cost_cap.py): what one
    # worker answers in STOP_S at the engine's top pace, plus one engine batch
    rows = config.batching.max_batch_size
    longest = max(_tokens(i)[1] for i in range(LINES))
    top_lines_per_s = rows / (longest * STEP_S)
    bound = (top_lines_per_s * STOP_S + rows) * max(per_line)
    overshoot = spent - cap
    print(
        f"cap {cap} tokens, spent {spent} ({len(output)} lines), overshoot {overshoot} "
        f"tokens (bound {bound:.0f}: {top_lines_per_s:.0f} lines/s for {STOP_S} s + {rows})"
    )
    assert 0 <= overshoot <= bound
    assert len(errors) > LINES / 2  # the cap stopped most of the batch


def test_the_cli_run_stops_at_its_cap_and_exits_5_saying_the_spend(
    config: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = 600
    cap = sum(sum(_tokens(i)) for i in range(lines)) // 5
    out, err = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["-c", str(write_config(config, tmp_path / "config.yaml")), "-o", str(out)]
    args += ["--errors", str(err), "-q", "--timeout", "120", "--max-tokens", str(cap)]
    with running_worker(config):
        code = main(["run", str(batch_file(tmp_path / "in.jsonl", lines)), *args])
    assert code == EXIT_CAPPED
    output, errors = _lines(out), _lines(err)
    ids = [str(line["custom_id"]) for line in output + errors]
    assert len(ids) == len(set(ids)) == lines
    assert errors and {line["error"]["code"] for line in errors} == {"4008"}
    spent = sum(line["response"]["body"]["usage"]["total_tokens"] for line in output)
    captured = capsys.readouterr()
    batch_id = captured.out.strip()  # run prints the batch id, and only it, on stdout
    assert (
        f"batchpipe: {batch_id} stopped at its cap: the batch reached its token cap of "
        f"{cap:,} ({spent:,} tokens spent); the lines not run are in the error file"
    ) in captured.err
