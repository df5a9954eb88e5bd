"""The other ends of a batch: ``failed`` (lines for another endpoint, named in
``errors.data``) and ``expired`` (every unanswered request 4006 in the error file); and the
server's health, readiness and metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from batchpipe.api import batches
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import batch_file, lines_of, wait_for
from worker.config import Config

pytestmark = pytest.mark.integration


def test_a_file_for_another_endpoint_fails_naming_its_lines(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat},
        {"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with serve(api_config) as server:
        client = sdk(server)
        file = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        failed = wait_for(client, batch.id, {"failed", "in_progress", "completed"})
        assert failed.status == "failed" and failed.failed_at is not None
        assert failed.errors is not None and failed.errors.data is not None
        assert [(e.line, e.param) for e in failed.errors.data] == [(2, "url")]


def test_a_batch_past_its_window_expires_with_4006_for_every_unanswered_request(
    api_config: Config, serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(batches.COMPLETION_WINDOWS_S, "24h", 1)  # no worker runs: it expires
    with serve(api_config) as server:
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", 4).open("rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        expired = wait_for(client, batch.id, {"expired", "completed", "failed"})
        assert expired.status == "expired" and expired.expired_at is not None
        assert expired.request_counts is not None
        assert (expired.request_counts.failed, expired.output_file_id) == (4, None)
        errors = lines_of(client, expired.error_file_id)
        assert sorted(line["custom_id"] for line in errors) == [f"req-{i}" for i in range(4)]  # type: ignore[type-var]
        assert {line["error"]["code"] for line in errors} == {"4006"}  # type: ignore[index]

        assert requests.get(f"{server.url}/healthz", timeout=10).json() == {"ok": True}
        assert requests.get(f"{server.url}/readyz", timeout=10).json() == {"ready": True}
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert "batchpipe_api_batches_created_total 1.0" in metrics


def test_a_broken_store_is_a_500_error_object_and_not_ready(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    with serve(api_config) as server:
        shutil.rmtree(Path(api_config.api.store_dir) / "objects")
        answer = requests.post(
            f"{server.url}/v1/files",
            headers={"Authorization": "Bearer sk-alice"},
            files={"file": ("in.jsonl", batch_file(tmp_path / "in.jsonl", 1).read_bytes())},
            data={"purpose": "batch"},
            timeout=30,
        )
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error"
        assert requests.get(f"{server.url}/readyz", timeout=10).status_code == 503
        assert sdk(server).files.list().data == []
