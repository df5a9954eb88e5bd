"""``batchpipe serve`` with ``kafka.routes``: a batch goes to its model's requests topic, and
a batch of a model without a route is refused with 400 naming the model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import requests

from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_http_errors import ALICE, error_of, published
from tests.integration.api.test_sdk_echo import batch_file, lines_of, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration


def test_batches_follow_their_models_route_and_an_unrouted_model_is_a_400(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    k = api_config.kafka
    echo_topic = f"{k.requests_topic}-echo"
    routed = replace(api_config, kafka=replace(k, routes={"echo": echo_topic, "other": "t-other"}))
    echo_group = replace(routed, kafka=replace(routed.kafka, requests_topic=echo_topic))
    unrouted = tmp_path / "gpt.jsonl"
    unrouted.write_text(batch_file(tmp_path / "e.jsonl", 2).read_text().replace('"echo"', '"gpt"'))
    with serve(routed) as server, running_worker(echo_group):
        alice = sdk(server)
        file = alice.files.create(file=unrouted.open("rb"), purpose="batch")
        refused = requests.post(
            f"{server.url}/v1/batches",
            headers=ALICE,
            json={
                "input_file_id": file.id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        error = error_of(refused, 400)
        assert (error.param, error.code) == ("input_file_id", "model_not_found")
        assert "model 'gpt' has no route" in error.message and "'echo'" in error.message
        assert alice.batches.list().data == []

        echo_file = alice.files.create(
            file=batch_file(tmp_path / "echo.jsonl", 3).open("rb"), purpose="batch"
        )
        batch = alice.batches.create(
            input_file_id=echo_file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(alice, batch.id, {"completed", "failed"})
        assert done.status == "completed", done.errors
        assert {line["custom_id"] for line in lines_of(alice, done.output_file_id)} == {
            "req-0",
            "req-1",
            "req-2",
        }
    # the default requests topic carried nothing: every request went by its route
    assert published(api_config) == 0
