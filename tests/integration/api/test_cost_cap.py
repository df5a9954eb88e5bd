"""A cost cap per batch end to end (issue 50): the official ``openai`` SDK against
``batchpipe serve`` with the defaults, on the session's broker, with a real echo worker
paced like a model. A 5,000-line batch capped at 20 % of its tokens stops within the
overshoot docs/api.md states, its output and error files hold every line once (the lines
not run with 4008), it ends ``cancelled`` naming the cap, and its webhook arrives."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests import ROOT
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import batch_file, lines_of, wait_for
from tests.integration.api.test_webhooks import SECRET, SECRET_ENV, Receiver, unwrap
from tests.integration.harness import running_worker, write_config
from worker.config import Config

pytestmark = pytest.mark.integration

LINES = 5_000
#: the echo engine's pace: each decoding step (one token of every row) costs this long
STEP_S = 0.005
#: the stated bound (docs/api.md "Cost caps"): what the fleet answers in this long after
#: the answer that reached the cap, plus the engine batch each worker has running
STOP_S = 0.5
STOPPED = "batch_cap_reached: the batch reached its token or cost cap before this request ran"


def _tokens(i: int) -> tuple[int, int]:
    """The echo engine's (prompt, completion) tokens of line ``i``: one a byte, the chat
    rendered ``user: hello i`` and answered ``hello i``."""
    return len(f"user: hello {i}\n"), len(f"hello {i}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


def test_a_batch_capped_at_a_fifth_of_its_tokens_stops_within_the_bound(
    api_config: Config,
    serve: Serve,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    config = replace(
        api_config,
        api=replace(
            api_config.api,
            poll_interval_ms=500,  # serve's default: a capped batch is read without pauses
            webhooks={"alice": {"url": receiver.url, "secret_env": SECRET_ENV}},
            webhook_allow_networks=("127.0.0.1/32",),
        ),
        engine=replace(api_config.engine, simulated_token_s=STEP_S),
    )
    per_line = [sum(_tokens(i)) for i in range(LINES)]
    cap = sum(per_line) // 5
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", LINES).open("rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"batchpipe_max_tokens": str(cap)},
        )
        assert batch.model_extra is not None
        assert batch.model_extra["batchpipe"]["spend"]["max_tokens"] == cap
        done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        output = lines_of(client, done.output_file_id)
        errors = lines_of(client, done.error_file_id)

    assert done.status == "cancelled", done
    assert done.errors is not None and done.errors.data is not None
    assert [(e.code, e.param) for e in done.errors.data] == [
        ("batch_cap_reached", "metadata.batchpipe_max_tokens")
    ]
    # every line once: what ran in the output, what did not in the error file, as 4008
    ids = [str(line["custom_id"]) for line in output + errors]
    assert len(ids) == len(set(ids)) == LINES
    assert {json.dumps(line["error"]) for line in errors} == {
        json.dumps({"code": "4008", "message": STOPPED, "param": None})
    }
    # the spend: each answer's usage is the echo's count, and the batch's is their sum
    spent = 0
    for line in output:
        i = int(str(line["custom_id"]).split("-")[1])
        usage = line["response"]["body"]["usage"]  # type: ignore[index]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == _tokens(i)
        spent += usage["total_tokens"]
    assert done.model_extra is not None
    shown = done.model_extra["batchpipe"]["spend"]
    assert shown["tokens"] == spent and shown["cap_reached_at"] is not None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (
        len(output),
        len(errors),
    )
    # the overshoot: at most what one worker answers in STOP_S at the engine's top pace
    # (a batch of max_batch_size rows every longest-completion steps), plus one such batch
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
    delivered = receiver.wait(lambda seen: len(seen) >= 1, "the batch.cancelled webhook")
    assert [unwrap(d) for d in delivered] == [("batch.cancelled", batch.id)]
    # the CLI, which reads Kafka itself: the same spend against the same cap
    config_path = write_config(config, tmp_path / "config.yaml")
    status = _cli("status", batch.id, "--json", "-c", str(config_path))
    assert json.loads(status)["batchpipe"]["spend"] == shown
    listed = _cli("list", "-c", str(config_path))
    assert f"spend {spent:,} of {cap:,} tokens, cap reached" in listed, listed


def _cli(*args: str) -> str:
    command = [sys.executable, "-m", "batchpipe.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout
