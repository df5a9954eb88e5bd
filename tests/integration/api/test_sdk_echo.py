"""The official ``openai`` SDK, unchanged, against ``batchpipe serve`` and an echo worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types import Batch

from tests.integration.api.conftest import Serve, sdk
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration

WAIT_S = 90.0


def batch_file(path: Path, count: int, prefix: str = "req") -> Path:
    lines = [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": [{"role": "user", "content": f"hello {i}"}]},
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def wait_for(client: OpenAI, batch_id: str, states: set[str], timeout_s: float = WAIT_S) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in states:
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch.status}"
        time.sleep(0.2)


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, object]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_files_batch_results_every_custom_id_once(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    with serve(api_config) as server, running_worker(api_config):
        client = sdk(server)
        uploaded = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", 25).open("rb"), purpose="batch"
        )
        assert uploaded.purpose == "batch" and uploaded.bytes > 0
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"job": "test"},
        )
        assert batch.status == "validating"
        done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (25, 25)
        assert done.usage is not None and done.usage.output_tokens > 0
        assert done.metadata == {"job": "test"}
        output = lines_of(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(  # type: ignore[type-var]
            f"req-{i}" for i in range(25)
        )
        assert done.error_file_id is None
        assert client.files.retrieve(done.output_file_id or "").purpose == "batch_output"
