"""``priority`` under serve from a key whose allowance is 0 (issue 50): a 400 naming
``metadata.batchpipe_tier`` at create, and a batch whose key lost its allowance after it
was created fails naming it instead of running as default; in memory, no broker."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpipe.api.lifecycle import Lifecycle
from batchpipe.client import Client
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
)
from worker.config import Config

BOB = {"Authorization": "Bearer sk-bob"}


def shares_config(tmp_path: Path, shares: dict[str, float]) -> Config:
    config = unit_config(tmp_path)
    return replace(config, scheduling=replace(config.scheduling, priority_shares=shares))


def test_priority_from_a_key_without_allowance_is_a_400_naming_the_field(tmp_path: Path) -> None:
    svc = services(shares_config(tmp_path, {"bob": 0.0}))
    with client(svc) as http:
        body: dict[str, Any] = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
        priority = {"metadata": {"batchpipe_tier": "priority"}}
        bobs = {**body, "input_file_id": stored_file(svc, owner="bob").id}
        answer = http.post("/v1/batches", headers=BOB, json={**bobs, **priority})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "metadata.batchpipe_tier"
        assert error["type"] == "invalid_request_error"
        assert "'priority' is refused for key 'bob'" in error["message"]
        assert "allowance is 0 (scheduling.priority_shares['bob'] = 0)" in error["message"]
        assert svc.state.batches() == []  # nothing created, so nothing to publish
        # bob's other tiers, and alice's priority (the default allowance, 0.5), are taken
        for who, ask in ((BOB, {**bobs, "metadata": {"batchpipe_tier": "flex"}}), (BOB, bobs)):
            assert http.post("/v1/batches", headers=who, json=ask).status_code == 200
        alices = {**body, "input_file_id": stored_file(svc).id, **priority}
        made = http.post("/v1/batches", headers=ALICE, json=alices)
        assert made.status_code == 200, made.text
        assert made.json()["batchpipe"]["tier"] == "priority"


def test_a_batch_whose_key_lost_its_allowance_fails_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[str] = []
    monkeypatch.setattr(Client, "publish_file", lambda *a, tier="", **k: published.append(tier))
    # the stored files hold "{}": the endpoint check is not what this test is about
    monkeypatch.setattr(Lifecycle, "_line_problems", lambda self, path, endpoint: [])
    # created while alice's allowance was the default; the operator has set it to 0 since
    svc = services(shares_config(tmp_path, {"alice": 0.0}))
    with client(svc):
        metadata = {"batchpipe_tier": "priority"}
        batch = stored_batch(svc, stored_file(svc), status="validating", metadata=metadata)
        flex = stored_batch(
            svc, stored_file(svc), status="validating", metadata={"batchpipe_tier": "flex"}
        )
        for made in (batch, flex):
            Lifecycle._validate_and_publish(svc.lifecycle, made.id)
        failed = svc.state.batch(batch.id)
    assert published == ["flex"]
    assert failed is not None and failed.status == "failed"
    (error,) = failed.errors
    assert error["param"] == "metadata.batchpipe_tier"
    assert error["code"] == "priority_not_allowed"
    assert "scheduling.priority_shares['alice'] = 0" in str(error["message"])
