"""Bad input over HTTP: each answered with an OpenAI error object, nothing stored or
published."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import TopicPartition

from batchpipe.api.app import Server
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import batch_file, wait_for
from tests.integration.harness import reader, running_worker
from tests.openai_sdk import ErrorObject, sdk_parse
from worker.config import Config
from worker.feeder.naming import pending_topic

pytestmark = pytest.mark.integration

ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}


def error_of(response: requests.Response, status: int) -> ErrorObject:
    assert response.status_code == status, response.text
    return sdk_parse(ErrorObject, response.json()["error"])


def upload(server: Server, content: bytes, purpose: str = "batch", **kw: Any) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/files",
        headers=kw.pop("headers", ALICE),
        files={"file": ("in.jsonl", content, "application/jsonl")},
        data={"purpose": purpose},
        timeout=30,
    )


def published(config: Config) -> int:
    """Records on the requests topic and its pending topic (fair share, on by default):
    the sum of their partitions' end offsets."""
    topics = [config.kafka.requests_topic, pending_topic(config.kafka.requests_topic)]
    consumer = reader(config, topics[0])
    try:
        total = 0
        for topic in topics:
            found = consumer.list_topics(topic, timeout=30).topics.get(topic)
            for p in found.partitions if found is not None and found.error is None else ():
                total += consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        return total
    finally:
        consumer.close()


def stored(config: Config) -> list[Path]:
    return list((Path(config.api.store_dir) / "objects").iterdir())


def test_bad_uploads_are_refused_and_nothing_is_stored(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = replace(
        api_config,
        api=replace(api_config.api, max_lines=3, max_line_bytes=400, max_file_bytes=2000),
    )
    good = batch_file(tmp_path / "good.jsonl", 2).read_bytes()
    with serve(config) as server:
        wrong_purpose = error_of(upload(server, good, purpose="fine-tune"), 400)
        assert wrong_purpose.param == "purpose"
        not_jsonl = error_of(upload(server, b"not json\n{}\n"), 400)
        assert not_jsonl.code == "invalid_file"
        assert "line 1" in not_jsonl.message and "line 2" in not_jsonl.message
        too_many = error_of(upload(server, batch_file(tmp_path / "m.jsonl", 4).read_bytes()), 400)
        assert "more than 3 requests" in too_many.message
        long_line = json.dumps({"custom_id": "x", "body": {"prompt": "y" * 500}}).encode()
        assert "limit of a line" in error_of(upload(server, long_line + b"\n"), 400).message
        assert error_of(upload(server, b"x" * 70_000), 413).code == "file_too_large"
        assert stored(config) == []
        assert sdk(server).files.list().data == []


def test_auth_ids_cursors_and_cancel(api_config: Config, serve: Serve, tmp_path: Path) -> None:
    with serve(api_config) as server, running_worker(api_config):
        url = server.url
        assert error_of(requests.get(f"{url}/v1/files"), 401).type == "invalid_request_error"
        wrong = requests.get(f"{url}/v1/batches", headers={"Authorization": "Bearer sk-nobody"})
        assert error_of(wrong, 401).code == "invalid_api_key"
        assert error_of(requests.get(f"{url}/v1/files/file-nope", headers=ALICE), 404).param
        assert error_of(requests.get(f"{url}/v1/batches/batch_nope", headers=ALICE), 404)
        missing_file = requests.post(
            f"{url}/v1/batches",
            headers=ALICE,
            json={
                "input_file_id": "file-nope",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert error_of(missing_file, 404).param == "input_file_id"
        bad_cursor = requests.get(f"{url}/v1/batches?after=batch_nope", headers=ALICE)
        assert error_of(bad_cursor, 400).param == "after"
        assert error_of(requests.get(f"{url}/v1/batches?limit=0", headers=ALICE), 400).param
        assert published(api_config) == 0

        alice = sdk(server)
        file = alice.files.create(
            file=batch_file(tmp_path / "a.jsonl", 3).open("rb"), purpose="batch"
        )
        wrong_endpoint = requests.post(  # an OpenAI batch endpoint batchpipe does not serve
            f"{url}/v1/batches",
            headers=ALICE,
            json={
                "input_file_id": file.id,
                "endpoint": "/v1/moderations",
                "completion_window": "24h",
            },
        )
        assert error_of(wrong_endpoint, 400).param == "endpoint"
        batch = alice.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # another key's objects do not exist for it
        assert error_of(requests.get(f"{url}/v1/batches/{batch.id}", headers=BOB), 404)
        assert error_of(requests.get(f"{url}/v1/files/{file.id}/content", headers=BOB), 404)
        assert error_of(requests.post(f"{url}/v1/batches/{batch.id}/cancel", headers=BOB), 404)
        assert sdk(server, "sk-bob").batches.list().data == []
        done = wait_for(alice, batch.id, {"completed"})
        cancel = requests.post(f"{url}/v1/batches/{done.id}/cancel", headers=ALICE)
        assert error_of(cancel, 409).code == "batch_not_cancellable"
