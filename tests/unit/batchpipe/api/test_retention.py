"""File expiry and retention (issue 26): ``expires_after`` on upload and
``output_expires_after`` on batch create as the official SDK sends them, the server's
default, expired files hidden at once and swept from the store, and a batch that reads an
input file kept whole until it ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from batchpipe.api.answerlog import answers_dir, log_path
from batchpipe.api.context import Services
from batchpipe.api.records import FileRecord, output_file_id
from batchpipe.api.retention import (
    MAX_EXPIRES_AFTER_S,
    MIN_EXPIRES_AFTER_S,
    expires_after,
    expiry,
)
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    LINE,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
)
from worker.config import ApiConfig

DAY = 24 * 3600


@contextmanager
def sdk(svc: Services) -> Iterator[tuple[OpenAI, TestClient]]:
    """The official SDK over the app in memory (its httpx client is the TestClient)."""
    with client(svc) as http:
        yield (
            OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-alice", http_client=http),
            http,
        )


def _upload(sdk_client: OpenAI, tmp_path: Path, **kwargs: Any) -> Any:
    source = tmp_path / "in.jsonl"
    source.write_bytes(LINE)
    return sdk_client.files.create(file=source.open("rb"), purpose="batch", **kwargs)


def _create_batch(http: TestClient, file_id: str, **fields: Any) -> Any:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    return http.post(
        "/v1/batches", headers=ALICE, json={**body, "completion_window": "24h", **fields}
    )


def test_upload_expires_after_sets_expires_at(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with sdk(svc) as (openai_client, _):
        policy = {"anchor": "created_at", "seconds": 3600}
        file = _upload(openai_client, tmp_path, expires_after=policy)
        assert file.expires_at == file.created_at + 3600
        assert openai_client.files.retrieve(file.id).expires_at == file.expires_at
        default = _upload(openai_client, tmp_path)
        assert default.expires_at == default.created_at + 30 * DAY


def test_default_zero_keeps_files_until_deleted(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path, file_expires_after_s=0))
    with sdk(svc) as (openai_client, _):
        assert _upload(openai_client, tmp_path).expires_at is None


@pytest.mark.parametrize(
    ("policy", "param"),
    [
        ({"anchor": "created_at", "seconds": MIN_EXPIRES_AFTER_S - 1}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": MAX_EXPIRES_AFTER_S + 1}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": "soon"}, "expires_after.seconds"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
        ({"seconds": 3600}, "expires_after.anchor"),
        ({"anchor": "created_at"}, "expires_after.seconds"),
    ],
)
def test_a_bad_upload_policy_is_a_400_naming_the_field(
    tmp_path: Path, policy: dict[str, Any], param: str
) -> None:
    svc = services(unit_config(tmp_path))
    with sdk(svc) as (openai_client, _):
        with pytest.raises(openai.BadRequestError) as refused:
            _upload(openai_client, tmp_path, expires_after=policy)
        assert refused.value.param == param
        assert openai_client.files.list().data == []  # nothing was stored


def test_an_unknown_form_field_is_a_400_naming_it(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        answer = http.post(
            "/v1/files",
            headers=ALICE,
            data={"purpose": "batch", "expires_at": "1"},
            files={"file": ("in.jsonl", LINE)},
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "expires_at"


@pytest.mark.parametrize(
    ("policy", "param"),
    [
        ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": True}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 3600.5}, "output_expires_after.seconds"),
        ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3600, "days": 1}, "output_expires_after.days"),
        ("1h", "output_expires_after"),
    ],
)
def test_a_bad_output_policy_is_a_400_naming_the_field(
    tmp_path: Path, policy: Any, param: str
) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        file = stored_file(svc)
        answer = _create_batch(http, file.id, output_expires_after=policy)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert svc.state.batches() == []


def test_output_expires_after_is_kept_for_the_output_files(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with sdk(svc) as (openai_client, _):
        file = _upload(openai_client, tmp_path)
        batch = openai_client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 7200},
        )
    record = svc.state.batch(batch.id)
    assert record is not None and record.output_expires_after == 7200
    # assemble stamps the output files with it, from when they are written
    assert expiry(1000, record.output_expires_after, svc.config.api) == 8200
    assert expiry(1000, None, ApiConfig()) == 1000 + 30 * DAY


def _expired(svc: Services, record: FileRecord) -> FileRecord:
    """``record`` written again as a file that expired a second ago."""
    gone = replace(record, expires_at=record.created_at - 1)
    svc.state.put_file(gone, idempotent=True)
    return gone


def test_an_expired_file_is_gone_for_its_owner_at_once(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        file = _expired(svc, stored_file(svc))
        assert http.get("/v1/files", headers=ALICE).json()["data"] == []
        for path in (f"/v1/files/{file.id}", f"/v1/files/{file.id}/content"):
            assert http.get(path, headers=ALICE).status_code == 404
        assert http.delete(f"/v1/files/{file.id}", headers=ALICE).status_code == 404
        answer = _create_batch(http, file.id)
        assert answer.status_code == 404
        assert answer.json()["error"]["param"] == "input_file_id"


def _stored(svc: Services, file_id: str) -> bool:
    try:
        with svc.store.local_copy(file_id):
            return True
    except FileNotFoundError:
        return False


def test_the_sweep_removes_expired_files_but_keeps_a_running_batchs_input(
    tmp_path: Path,
) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        idle = _expired(svc, stored_file(svc))
        running_input = _expired(svc, stored_file(svc))
        fresh = stored_file(svc)
        fresh = replace(fresh, expires_at=fresh.created_at + DAY)
        svc.state.put_file(fresh, idempotent=True)
        batch = stored_batch(svc, running_input, status="in_progress")
        sweep = svc.lifecycle.retention.sweep

        assert sweep(running_input.created_at) == [idle.id]
        assert svc.state.file(idle.id) is None and not _stored(svc, idle.id)
        # the running batch's input stays whole (the batch needs it to end), hidden
        assert _stored(svc, running_input.id) and svc.state.file(running_input.id)
        assert http.get(f"/v1/files/{running_input.id}", headers=ALICE).status_code == 404
        assert _stored(svc, fresh.id)

        ended = svc.state.put_batch(replace(batch, status="completed"))
        assert sweep(running_input.created_at) == [running_input.id]
        assert not _stored(svc, running_input.id)
        # the batch that read it stays readable
        shown = http.get(f"/v1/batches/{ended.id}", headers=ALICE)
        assert shown.status_code == 200
        assert shown.json()["input_file_id"] == running_input.id
        assert shown.json()["status"] == "completed"
        # the fresh file expires on its own schedule
        assert sweep(fresh.created_at + DAY - 1) == []
        assert sweep(fresh.created_at + DAY) == [fresh.id]


def test_output_files_are_swept_on_their_schedule(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    file = stored_file(svc)
    batch = stored_batch(svc, file, status="completed", output_expires_after=3600)
    output = FileRecord(
        id=output_file_id(batch.id, "output"),
        owner="alice",
        filename="out.jsonl",
        size=3,
        created_at=file.created_at + 10,
        purpose="batch_output",
        expires_at=expiry(file.created_at + 10, batch.output_expires_after, svc.config.api),
    )
    with svc.store.staging() as path:
        path.write_text("{}\n")
        svc.store.put(output.id, path)
    svc.state.put_file(output, idempotent=True)
    logs = answers_dir(svc.config.api)  # the batch's answer log goes with its files
    logs.mkdir(parents=True)
    log_path(logs, batch.id).write_bytes(b"{}\n")
    sweep = svc.lifecycle.retention.sweep
    assert sweep(output.created_at + 3599) == []
    assert log_path(logs, batch.id).exists()
    assert sweep(output.created_at + 3600) == [output.id]
    assert not _stored(svc, output.id)
    assert not log_path(logs, batch.id).exists()
    assert svc.state.batch(batch.id) is not None


def test_policy_parser_accepts_the_bounds() -> None:
    for seconds in (MIN_EXPIRES_AFTER_S, MAX_EXPIRES_AFTER_S):
        assert expires_after({"anchor": "created_at", "seconds": seconds}, "f") == seconds
