"""Item 5 of issue 41 and ``GET /v1/models``: the fleet's models, from its workers'
announcements, read with the official SDK; a batch for a model no worker serves is
refused at once, by ``serve`` and by ``submit``, naming the models served."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from tests.e2e.cli import clean_env, run, serving, wait_until, worker, write_config
from tests.integration.fleet import free_port

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-models"


def batch(path: Path, model: str) -> Path:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
    }
    path.write_text(json.dumps(line) + "\n")
    return path


def test_the_fleet_lists_its_models_and_refuses_a_batch_for_another(
    tmp_path: Path, broker: str
) -> None:
    port = free_port()
    config = write_config(tmp_path, broker, {"kind": "echo"}, api={"port": port})
    env = clean_env(BATCHPIPE_API_KEYS=KEY, HOME=str(tmp_path / "home"))
    with serving(config, port, env, tmp_path), worker(config, env=env):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
        wait_until(lambda: [m.id for m in client.models.list()] == ["echo"], 60, "echo announced")
        model = client.models.retrieve("echo")
        assert (model.id, model.object, model.owned_by) == ("echo", "model", "batchpipe")

        wrong = client.files.create(
            file=batch(tmp_path / "gpt.jsonl", "gpt-4o-mini").open("rb"), purpose="batch"
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(
                input_file_id=wrong.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert "gpt-4o-mini" in str(refused.value) and "'echo'" in str(refused.value)

        done = run("submit", str(tmp_path / "gpt.jsonl"), "-c", str(config), env=env)
        assert done.returncode == 2, done.stderr
        assert "gpt-4o-mini" in done.stderr and "'echo'" in done.stderr

        right = run("submit", str(batch(tmp_path / "echo.jsonl", "echo")), "-c", str(config))
        assert right.returncode == 0, right.stderr
    # a worker stopped cleanly withdraws its model
    with serving(config, port, env, tmp_path):
        wait_until(lambda: [m.id for m in client.models.list()] == [], 60, "echo withdrawn")
