"""``POST /v1/batches/{id}/retry`` as clients misuse it: an unknown or another key's
batch, one not ended, a body with parameters, a first batch whose files are gone — each a
4xx in OpenAI's error shape naming why, never a 500; and what a retry carries over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from batchpipe.api.context import Services
from batchpipe.api.records import BatchRecord
from batchpipe.api.retry import earlier
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    LINE,
    FakeLog,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
)


def line(custom_id: str) -> bytes:
    return LINE.replace(b'"custom_id": "a"', f'"custom_id": "{custom_id}"'.encode())


def error(custom_id: str, code: str) -> bytes:
    doc = {"id": "x", "custom_id": custom_id, "response": None,
           "error": {"code": code, "message": "m"}}  # fmt: skip
    return json.dumps(doc).encode() + b"\n"


def ended(svc: Services, **changes: Any) -> BatchRecord:
    """A completed batch of three lines: ``boom`` failed in the engine (5000), ``bad``
    as bad input (4002), ``ok`` answered."""
    source = stored_file(svc, content=line("ok") + line("boom") + line("bad"), lines=3)
    errors = stored_file(svc, content=error("boom", "5000") + error("bad", "4002"), lines=2)
    return stored_batch(svc, source, status="completed", error_file_id=errors.id, **changes)


def refusal(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"
    return body


@pytest.fixture
def svc(tmp_path: Path) -> Services:
    return services(unit_config(tmp_path))


def retry(api: TestClient, batch_id: str, **kwargs: Any) -> Any:
    return api.post(f"/v1/batches/{batch_id}/retry", headers=ALICE, **kwargs)


def test_an_unknown_or_another_keys_batch_is_a_404(svc: Services) -> None:
    batch = ended(svc)
    with client(svc) as api:
        unknown = refusal(retry(api, "batch_nope"), 404)
        theirs = refusal(
            api.post(f"/v1/batches/{batch.id}/retry", headers={"Authorization": "Bearer sk-bob"}),
            404,
        )
        assert api.post(f"/v1/batches/{batch.id}/retry").status_code == 401
    assert (unknown["param"], unknown["code"]) == ("batch_id", "not_found")
    assert "batch_nope" in unknown["message"] and theirs["code"] == "not_found"


def test_a_batch_not_ended_is_a_409_saying_so(svc: Services) -> None:
    batch = stored_batch(svc, stored_file(svc), status="in_progress")
    with client(svc) as api:
        body = refusal(retry(api, batch.id), 409)
    assert body["code"] == "batch_not_ended" and "in_progress" in body["message"]


@pytest.mark.parametrize(
    ("kwargs", "param", "message"),
    [
        ({"json": {"metadata": {"a": "b"}}}, "metadata", "metadata: unknown parameter"),
        ({"json": {"batch_id": 5}}, "batch_id", "batch_id: unknown parameter"),
        ({"json": ["x"]}, None, "must be a JSON object"),
        ({"content": b"{not json"}, None, "not JSON"),
        ({"content": b"[" * 100_000}, None, "not JSON"),
    ],
)
def test_a_body_with_parameters_is_a_400_naming_them(
    svc: Services, kwargs: dict[str, Any], param: str | None, message: str
) -> None:
    batch = ended(svc)
    with client(svc) as api:
        body = refusal(retry(api, batch.id, **kwargs), 400)
        assert (body["param"], message in body["message"]) == (param, True), body
        assert retry(api, batch.id, json={}).status_code == 200  # an empty object is none


@pytest.mark.parametrize("which", ["input", "error"])
def test_a_first_batch_whose_file_is_gone_is_a_409_naming_it(svc: Services, which: str) -> None:
    batch = ended(svc)
    file_id = batch.input_file_id if which == "input" else batch.error_file_id
    with client(svc) as api:
        assert api.delete(f"/v1/files/{file_id}", headers=ALICE).status_code == 200
        body = refusal(retry(api, batch.id), 409)
    assert body["code"] == f"{which}_file_missing" and str(file_id) in body["message"]


def test_a_retry_runs_exactly_the_engine_failures_and_keeps_the_first_batchs_settings(
    svc: Services,
) -> None:
    batch = ended(svc, metadata={"job": "nightly"}, output_expires_after=7200)
    with client(svc) as api:
        answer = retry(api, batch.id)
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        new = doc["batch"]
        content = api.get(f"/v1/files/{new['input_file_id']}/content", headers=ALICE).content
    assert (doc["retried"], doc["retry_of"]) == (1, batch.id)
    assert [(n["custom_id"], n["code"]) for n in doc["not_retried"]] == [("bad", "4002")]
    assert content == line("boom")
    assert new["metadata"] == {"job": "nightly", "batchpipe_retry_of": batch.id}
    created = svc.state.batch(new["id"])
    assert created is not None and created.output_expires_after == 7200


def test_a_second_retry_answers_the_first_retry_batch_and_creates_nothing(
    svc: Services,
) -> None:
    batch = ended(svc)
    with client(svc) as api:
        first = retry(api, batch.id).json()
        files = len(svc.state.files("alice"))
        again = retry(api, batch.id)
        assert again.status_code == 200, again.text
        listed = api.get("/v1/batches", headers=ALICE).json()["data"]
    second = again.json()
    assert (first["already_retried"], second["already_retried"]) == (False, True)
    assert second["batch"]["id"] == first["batch"]["id"]
    assert {k: v for k, v in second.items() if k not in ("batch", "already_retried")} == {
        k: v for k, v in first.items() if k not in ("batch", "already_retried")
    }
    assert len(svc.state.files("alice")) == files  # no second input file either
    assert [b["id"] for b in listed if b["metadata"].get("batchpipe_retry_of") == batch.id] == [
        first["batch"]["id"]
    ]


def test_the_earlier_retry_is_found_from_the_state_topic_alone(tmp_path: Path) -> None:
    """A restarted server (a new view of the same log) answers the retry batch made
    before; the retry batch itself has no retry of its own yet."""
    log = FakeLog()
    one = services(unit_config(tmp_path), log=log)
    batch = ended(one)
    with client(one) as api:
        made = retry(api, batch.id).json()["batch"]["id"]
    two = services(unit_config(tmp_path), log=log)
    with client(two) as api:
        again = retry(api, batch.id).json()
        made_record = two.state.batch(made)
        assert made_record is not None and earlier(two, made_record) is None
    assert (again["already_retried"], again["batch"]["id"]) == (True, made)
