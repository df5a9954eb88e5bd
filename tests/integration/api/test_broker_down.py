"""The broker process stops under a running server (issue 24, defect 6): /readyz fails,
requests that need Kafka are 503 with Retry-After instead of hanging 30 s into a 500, and
what the server holds is still answered. A broker of its own: the session's stays up."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from batchpipe.api.app import Server
from tests.integration.api.conftest import KEYS
from tests.integration.api.test_sdk_echo import batch_file
from tests.integration.harness import isolated_config
from worker.config import EngineConfig
from worker.kafka.broker import EmbeddedBroker

pytestmark = pytest.mark.integration

ALICE = {"Authorization": "Bearer sk-alice"}
#: a request answered later than this hung (Kafka's own timeouts are 30 s and more)
_ANSWER_S = 25


def test_a_stopped_broker_is_503s_not_hangs(tmp_path: Path) -> None:
    with EmbeddedBroker() as broker:
        config = isolated_config(broker.bootstrap)
        config = replace(
            config,
            api=replace(config.api, store_dir=str(tmp_path / "files"), poll_interval_ms=100),
            engine=EngineConfig(kind="echo"),
        )
        with Server(config, KEYS, port=0) as server:
            url = server.url
            content = batch_file(tmp_path / "in.jsonl", 3).read_bytes()
            form = {"file": ("in.jsonl", content)}
            purpose = {"purpose": "batch"}
            file = requests.post(
                f"{url}/v1/files", headers=ALICE, files=form, data=purpose, timeout=30
            ).json()
            body = {
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            created = requests.post(f"{url}/v1/batches", headers=ALICE, json=body, timeout=30)
            assert created.status_code == 200, created.text
            batch_id = created.json()["id"]
            broker.stop()
            deadline = time.monotonic() + 60
            while requests.get(f"{url}/readyz", timeout=_ANSWER_S).status_code != 503:
                assert time.monotonic() < deadline, "/readyz kept answering 200"
            assert requests.get(f"{url}/healthz", timeout=_ANSWER_S).status_code == 200
            refused = [
                requests.post(f"{url}/v1/batches", headers=ALICE, json=body, timeout=_ANSWER_S),
                requests.post(
                    f"{url}/v1/files", headers=ALICE, files=form, data=purpose, timeout=_ANSWER_S
                ),
                requests.post(
                    f"{url}/v1/batches/{batch_id}/cancel", headers=ALICE, timeout=_ANSWER_S
                ),
                requests.get(f"{url}/v1/files/file-nothing", headers=ALICE, timeout=_ANSWER_S),
            ]
            for answer in refused:
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"].isdigit()
                assert "rdkafka" not in answer.text.lower()
            held = requests.get(f"{url}/v1/batches/{batch_id}", headers=ALICE, timeout=_ANSWER_S)
            assert held.status_code == 200
            mine = requests.get(f"{url}/v1/files", headers=ALICE, timeout=_ANSWER_S).json()
            assert [f["id"] for f in mine["data"]] == [file["id"]]
