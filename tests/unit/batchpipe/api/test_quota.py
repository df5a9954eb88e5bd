"""The enqueued-token limit per key (issue 23): a batch that would take its key over
api.max_enqueued_tokens ends failed with token_limit_exceeded naming the limit and is
never published; one under it runs; other keys are not counted against it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from msgspec import structs

from batchpipe.api.quota import LIMIT_CODE
from batchpipe.api.records import FileRecord
from tests.unit.batchpipe.api.fakes import ALICE, client, services, stored_file, unit_config
from worker.feeder.estimate import request_tokens
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

BOB = {"Authorization": "Bearer sk-bob"}
# LINE: "hi" (1 token at 4 characters a token) + generation.max_tokens (256)
_PER_LINE = 257


def _upload(svc: Any, owner: str, lines: int) -> FileRecord:
    return stored_file(svc, owner, lines)


def test_the_estimate_is_prompt_characters_over_4_plus_max_tokens() -> None:
    chat = InferenceRequest("a", messages=(ChatMessage("user", "x" * 9),))
    assert request_tokens(chat, 256) == 3 + 256
    capped = structs.replace(chat, sampling=SamplingParams(max_tokens=10))
    assert request_tokens(capped, 256) == 3 + 10
    assert request_tokens(InferenceRequest("b", prompt_token_ids=(1, 2, 3, 4, 5)), 0) == 5
    assert request_tokens(InferenceRequest("c", embedding_inputs=("abcd", "ef")), 256) == 2


def test_a_batch_over_the_limit_fails_unpublished_and_one_under_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = services(unit_config(tmp_path, max_enqueued_tokens={"alice": 3 * _PER_LINE}))
    published: list[str] = []
    monkeypatch.setattr(svc.lifecycle, "created", lambda batch: published.append(batch.id))

    def create(headers: dict[str, str], file: FileRecord) -> dict[str, Any]:
        body = {"input_file_id": file.id, "endpoint": "/v1/chat/completions"}
        answer = http.post(
            "/v1/batches", headers=headers, json={**body, "completion_window": "24h"}
        )
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    with client(svc) as http:
        first = create(ALICE, _upload(svc, "alice", 2))
        assert first["status"] == "validating"
        refused = create(ALICE, _upload(svc, "alice", 2))
        assert refused["status"] == "failed"
        error = refused["errors"]["data"][0]
        assert error["code"] == LIMIT_CODE
        assert f"api.max_enqueued_tokens ({3 * _PER_LINE})" in error["message"]
        assert published == [first["id"]]  # nothing published for the refused batch
        # another key has no limit and is not counted against alice's
        assert create(BOB, _upload(svc, "bob", 5))["status"] == "validating"
        # once alice's first batch has ended, a batch under the limit runs
        batch = svc.state.batch(first["id"])
        assert batch is not None
        svc.state.put_batch(replace(batch, status="completed"))
        assert create(ALICE, _upload(svc, "alice", 3))["status"] == "validating"
    assert len(published) == 3


def test_star_limits_every_key_not_named(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path, max_enqueued_tokens={"*": _PER_LINE}))
    with client(svc) as http:
        body = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
        answer = http.post(
            "/v1/batches", headers=BOB, json={**body, "input_file_id": _upload(svc, "bob", 2).id}
        )
        assert answer.json()["errors"]["data"][0]["code"] == LIMIT_CODE
