"""``batchpipe retry`` against ``batchpipe serve``: a batch whose engine failed on some
lines (5000) and refused others as bad input (4002) gets a new batch of exactly the
engine's failures, linked by metadata, which completes once the engine is well; the bad
input is listed with why. Retrying it again answers that same batch and makes no other."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import requests

from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import lines_of, wait_for
from tests.integration.harness import running_worker
from worker.config import Config
from worker.engines.base import EngineInput, OnComplete
from worker.engines.echo import EchoEngine
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import InferenceRequest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


class Flaky(EchoEngine):
    """Echo, but the engine fails on prompts with "boom" in them while ``broken``
    (5000 once split down to the one request), and "bad input" is refused (4002)."""

    def __init__(self, *, broken: bool) -> None:
        super().__init__()
        self.broken = broken

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        if any("bad input" in m.content for m in request.messages):
            raise RequestError(ErrorCode.INVALID_PARAMETER, "bad input", request.custom_id)
        return super().encode(request)

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        if self.broken and any(b"boom" in bytes(i.prompt_token_ids) for i in inputs):
            raise RuntimeError("the engine broke")
        super().run_batch(inputs, on_complete)


def line(custom_id: str, content: str) -> str:
    body = {"model": "echo", "messages": [{"role": "user", "content": content}]}
    request = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**request, "body": body}) + "\n"


def retry_cli(batch_id: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"OPENAI_API_KEY": "sk-alice", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "batchpipe.cli", "retry", batch_id, "--url", url],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_retry_makes_a_batch_of_exactly_the_engine_failures_and_it_completes(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    kinds = {f"ok-{i}": f"hello {i}" for i in range(4)}
    kinds |= {f"boom-{i}": f"boom {i}" for i in range(3)}
    kinds |= {f"bad-{i}": f"bad input {i}" for i in range(2)}
    source.write_text("".join(line(k, v) for k, v in kinds.items()))
    with serve(api_config) as server:
        client = sdk(server)
        file = client.files.create(file=source.open("rb"), purpose="batch")
        first = client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        with running_worker(api_config, Flaky(broken=True)):
            ended = wait_for(client, first.id, {"completed", "failed", "expired", "cancelled"})
        assert ended.request_counts is not None and ended.request_counts.failed == 5
        codes = {e["custom_id"]: e["error"]["code"] for e in lines_of(client, ended.error_file_id)}  # type: ignore[index]
        assert codes == {**dict.fromkeys(["boom-0", "boom-1", "boom-2"], "5000"),
                         "bad-0": "4002", "bad-1": "4002"}  # fmt: skip

        cli = retry_cli(first.id, server.url)
        assert cli.returncode == 0, cli.stderr
        second_id = cli.stdout.strip()
        assert "not retried: bad-0 (4002): an invalid parameter" in cli.stderr
        assert "not retried: bad-1 (4002)" in cli.stderr and "boom" not in cli.stderr

        # a second retry (the command run twice, a click in another tab) makes nothing new
        twice = retry_cli(first.id, server.url)
        assert (twice.returncode, twice.stdout.strip()) == (0, second_id), twice.stderr
        assert f"{first.id} already retried as {second_id}" in twice.stderr
        thrice = requests.post(
            f"{server.url}/v1/batches/{first.id}/retry",
            headers={"Authorization": "Bearer sk-alice"}, timeout=30,
        )  # fmt: skip
        assert thrice.status_code == 200, thrice.text
        assert (thrice.json()["already_retried"], thrice.json()["batch"]["id"]) == (True, second_id)
        assert (thrice.json()["retried"], len(thrice.json()["not_retried"])) == (3, 2)
        retries = [b.id for b in client.batches.list(limit=100)
                   if (b.metadata or {}).get("batchpipe_retry_of") == first.id]  # fmt: skip
        assert retries == [second_id]

        second = client.batches.retrieve(second_id)
        assert second.metadata == {"job": "nightly", "batchpipe_retry_of": first.id}
        assert second.request_counts is not None and second.request_counts.total == 3
        retried = client.files.content(second.input_file_id).text
        assert retried == "".join(line(f"boom-{i}", f"boom {i}") for i in range(3))
        with running_worker(api_config, Flaky(broken=False)):
            done = wait_for(client, second_id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
        answered = sorted(str(x["custom_id"]) for x in lines_of(client, done.output_file_id))
        assert answered == ["boom-0", "boom-1", "boom-2"]

        # nothing left worth retrying in the second; another key cannot see the first
        again = requests.post(
            f"{server.url}/v1/batches/{second_id}/retry",
            headers={"Authorization": "Bearer sk-alice"}, timeout=30,
        )  # fmt: skip
        assert again.json()["batch"] is None and again.json()["not_retried"] == []
        other = requests.post(
            f"{server.url}/v1/batches/{first.id}/retry",
            headers={"Authorization": "Bearer sk-bob"}, timeout=30,
        )  # fmt: skip
        assert other.status_code == 404
