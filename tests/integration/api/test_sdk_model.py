"""The official ``openai`` SDK against ``batchpipe serve`` and a worker running the
default real model (SmolLM2-135M-Instruct on CPU): a few short requests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import lines_of, wait_for
from tests.integration.harness import running_worker
from tests.openai_sdk import ChatCompletion, sdk_parse
from worker.config import Config, EngineConfig

pytestmark = [pytest.mark.integration, pytest.mark.model]


def test_sdk_batch_on_the_default_model(api_config: Config, serve: Serve, tmp_path: Path) -> None:
    config = replace(api_config, engine=EngineConfig())  # hf, smollm2-135m-instruct
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"q{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "smollm2-135m-instruct",
                        "messages": [{"role": "user", "content": question}],
                        "max_tokens": 8,
                    },
                }
            )
            + "\n"
            for i, question in enumerate(["What is 2+2?", "Name a colour.", "Say hi."])
        )
    )
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # the model loads and generates on a shared CPU
        done = wait_for(client, batch.id, {"completed", "failed", "cancelled", "expired"}, 600)
        assert done.status == "completed"
        output = lines_of(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == ["q0", "q1", "q2"]  # type: ignore[type-var]
        for line in output:
            body = sdk_parse(ChatCompletion, line["response"]["body"])  # type: ignore[index]
            assert body.choices[0].message.content
            assert body.usage is not None and 0 < body.usage.completion_tokens <= 8
