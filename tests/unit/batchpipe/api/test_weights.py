"""Fair share under serve (issue 23): a key's weight from api.key_weights, a batch's
metadata batchpipe_weight at most that, refused as a 400 naming it otherwise, and the
lifecycle publishing the batch with its weight."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpipe.api.weights import batch_weight, key_weight, published_weight
from batchpipe.client import Client
from tests.unit.batchpipe.api.fakes import ALICE, client, services, stored_file, unit_config
from worker.config import ConfigError, SchedulingConfig, load_config


def test_key_weight_from_the_owner_else_the_scheduling_default(tmp_path: Path) -> None:
    config = unit_config(tmp_path, key_weights={"alice": 3.0})
    config = replace(config, scheduling=replace(SchedulingConfig(), weight=2.0))
    assert key_weight(config, "alice") == 3.0
    assert key_weight(config, "bob") == 2.0
    assert batch_weight(config, "alice", {}) == 3.0
    assert batch_weight(config, "alice", {"batchpipe_weight": "0.5"}) == 0.5
    assert batch_weight(config, "alice", {"batchpipe_weight": "3"}) == 3.0
    for wrong in ("3.5", "0", "-1", "nan", "inf", "x", "", "1e-308", "5e-324", "1e-305", "0.0009"):
        with pytest.raises(
            ValueError,
            match=r"metadata\.batchpipe_weight.*at least 0.001 and at most this key's weight 3",
        ):
            batch_weight(config, "alice", {"batchpipe_weight": wrong})
    # the operator lowered the key's weight after the batch was created: the ceiling holds
    assert published_weight(config, "bob", {"batchpipe_weight": "3"}) == 2.0


def test_a_batch_weight_above_the_key_is_a_400_naming_it(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path, key_weights={"alice": 2.0}))
    with client(svc) as http:
        file = stored_file(svc)
        body = {
            "input_file_id": file.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        # issue 38: 1e-308 passed and overflowed every feeder of the fleet
        for wrong in ("2.5", "heavy", "0", "1e-308", "5e-324", "1e-305"):
            answer = http.post(
                "/v1/batches", headers=ALICE, json={**body, "metadata": {"batchpipe_weight": wrong}}
            )
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == "metadata.batchpipe_weight"
            assert "at least 0.001 and at most this key's weight 2" in error["message"]
        ok = http.post(
            "/v1/batches", headers=ALICE, json={**body, "metadata": {"batchpipe_weight": "1.5"}}
        )
        assert ok.status_code == 200, ok.text
        floor = http.post(
            "/v1/batches", headers=ALICE, json={**body, "metadata": {"batchpipe_weight": "0.001"}}
        )
        assert floor.status_code == 200, floor.text


def test_the_lifecycle_publishes_with_the_batch_weight_and_the_owner_as_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchpipe.api.lifecycle import Lifecycle
    from tests.unit.batchpipe.api.fakes import stored_batch

    svc = services(unit_config(tmp_path, key_weights={"alice": 4.0}))
    published: list[Any] = []

    def publish_file(
        self: Client, *args: Any, weight: float | None = None, key: str = "", tier: str = ""
    ) -> None:
        published.append((weight, key, tier))

    monkeypatch.setattr(Client, "publish_file", publish_file)
    # the stored files hold "{}": the endpoint check is not what this test is about
    monkeypatch.setattr(Lifecycle, "_line_problems", lambda self, path, endpoint: [])
    with client(svc):
        plain = stored_batch(svc, stored_file(svc), status="validating")
        light = stored_batch(
            svc, stored_file(svc), status="validating", metadata={"batchpipe_weight": "0.25"}
        )
        flex = stored_batch(
            svc, stored_file(svc), status="validating", metadata={"batchpipe_tier": "flex"}
        )
        for batch in (plain, light, flex):
            Lifecycle._validate_and_publish(svc.lifecycle, batch.id)
    # the owner is the key whose share both batches take (issue 33: keys first); the tier
    # its metadata asks for (issue 50)
    assert published == [
        (4.0, plain.owner, "default"),
        (0.25, light.owner, "default"),
        (4.0, flex.owner, "flex"),
    ]
    assert plain.owner


@pytest.mark.parametrize(
    "setting", ["scheduling.weight=1e-308", "api.key_weights.alice=5e-324", "scheduling.weight=0"]
)
def test_a_configured_weight_below_the_floor_is_refused_naming_it(setting: str) -> None:
    with pytest.raises(ConfigError, match=setting.split("=")[0].replace(".", r"\.")):
        load_config(sets=[setting], environ={})
