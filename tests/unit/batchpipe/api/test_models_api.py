"""``GET /v1/models`` as the official SDK reads it: shape, 404, auth, hostile announcements."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from batchpipe.fleet import FleetModels, apply_record
from tests.unit.batchpipe.api.fakes import client, services, unit_config
from worker.obs.announce import Announcement


def _sdk(test_client: TestClient, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(
        api_key=key, base_url="http://127.0.0.1:8000/v1", http_client=test_client, max_retries=0
    )


def _fleet(tmp_path: Path, records: list[tuple[bytes, bytes]]) -> FleetModels:
    fleet = FleetModels(unit_config(tmp_path).kafka)  # not started: fed by hand
    for key, value in records:
        apply_record(fleet._announced, key, value)
    return fleet


def test_the_sdk_lists_and_retrieves_models_and_an_unknown_id_is_openais_404(
    tmp_path: Path,
) -> None:
    now = time.time()
    live = Announcement("w1", "echo", "requests", "g", ("chat",), now)
    svc = replace(services(unit_config(tmp_path)), fleet=_fleet(tmp_path, [(b"w1", live.encode())]))
    with client(svc) as test_client:
        sdk = _sdk(test_client)
        models = sdk.models.list()
        assert [(m.id, m.object, m.owned_by) for m in models.data] == [
            ("echo", "model", "batchpipe")
        ]
        assert models.data[0].created == int(now)
        assert sdk.models.retrieve("echo").id == "echo"
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.models.retrieve("gpt-ünknown")
        error = missing.value.body
        assert isinstance(error, dict)
        assert error["code"] == "not_found" and "gpt-ünknown" in error["message"]
        assert set(error) >= {"message", "type", "param", "code"}
        with pytest.raises(openai.NotFoundError) as long_id:
            sdk.models.retrieve("m" * 12_000)
        assert len(str(long_id.value)) < 1_000  # the caller's id is not echoed whole
        stranger = _sdk(test_client, key="sk-nobody")
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()
        with pytest.raises(openai.AuthenticationError):
            stranger.models.retrieve("echo")


def test_hostile_announcements_leave_the_listing_served_and_bounded(tmp_path: Path) -> None:
    now = time.time()
    live = Announcement("w1", "echo", "requests", "g", ("chat",), now)
    hostile = [
        (b"inf", json.dumps(live.__dict__ | {"at": float("inf")}).encode()),
        (
            b"huge",
            b'{"worker_id":"x","model":"m","requests_topic":"t","group_id":"g",'
            b'"endpoints":[],"at":1e400}',
        ),
        (b"future", json.dumps(live.__dict__ | {"model": "f", "at": now + 1e9}).encode()),
        (b"nan", json.dumps(live.__dict__ | {"model": "n", "at": float("nan")}).encode()),
        (b"long", json.dumps(live.__dict__ | {"model": "L" * 10_000}).encode()),
        (b"list", b"[1, 2, 3]"),
        (b"bytes", bytes(range(256))),
    ]
    fleet = _fleet(tmp_path, [(b"w1", live.encode()), *hostile])
    svc = replace(services(unit_config(tmp_path)), fleet=fleet)
    with client(svc) as test_client:
        listed = test_client.get("/v1/models", headers={"Authorization": "Bearer sk-alice"})
    assert listed.status_code == 200
    assert [m["id"] for m in listed.json()["data"]] == ["echo"]


@pytest.mark.parametrize("model", ["ü" * 100_000, "模型-🙂", "gpt\u202e-evil"])
def test_a_batch_for_a_model_nobody_serves_is_a_bounded_400_naming_the_field(
    tmp_path: Path, model: str
) -> None:
    live = Announcement("w1", "echo", "requests", "g", ("chat",), time.time())
    fleet = _fleet(tmp_path, [(b"w1", live.encode())])
    svc = replace(services(unit_config(tmp_path)), fleet=fleet)
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    with client(svc) as test_client:
        sdk = _sdk(test_client)
        uploaded = sdk.files.create(
            file=("in.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch"
        )
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["param"], error["code"]) == ("input_file_id", "model_not_found")
    assert len(error["message"]) < 1_000 and "'echo'" in error["message"]
    assert repr(model)[1:21] in error["message"]  # escaped: no control character
