"""The official ``openai`` SDK against ``batchpipe serve`` and a worker running a real
model on CPU: the default SmolLM2-135M-Instruct (a few short chat requests), and the
embedding model all-MiniLM-L6-v2 (an embeddings batch)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import lines_of, wait_for
from tests.integration.harness import running_worker
from tests.openai_sdk import ChatCompletion, CreateEmbeddingResponse, sdk_line, sdk_parse
from worker.config import Config, EngineConfig
from worker.known_models import EMBEDDING_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.model]


def completed_output(
    config: Config, serve: Serve, source: Path, endpoint: str
) -> dict[str, dict[str, Any]]:
    """``source`` run as a batch through the SDK and a worker: its output lines by id."""
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
        )
        # the model loads and runs on a shared CPU
        done = wait_for(client, batch.id, {"completed", "failed", "cancelled", "expired"}, 600)
        assert done.status == "completed"
        return {str(line["custom_id"]): line for line in lines_of(client, done.output_file_id)}


def test_sdk_batch_on_the_default_model(api_config: Config, serve: Serve, tmp_path: Path) -> None:
    config = replace(api_config, engine=EngineConfig(kind="hf"))  # smollm2-135m-instruct
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
    output = completed_output(config, serve, source, "/v1/chat/completions")
    assert sorted(output) == ["q0", "q1", "q2"]
    for line in output.values():
        body = sdk_parse(ChatCompletion, line["response"]["body"])
        assert body.choices[0].message.content
        assert body.usage is not None and 0 < body.usage.completion_tokens <= 8


def test_sdk_embeddings_batch_on_minilm(api_config: Config, serve: Serve, tmp_path: Path) -> None:
    """A /v1/embeddings batch through the API, answered by an hf embedding worker: the
    output file's bodies read as the SDK's CreateEmbeddingResponse, float and base64."""
    engine = EngineConfig(model=EMBEDDING_MODEL, task="embed", device="cpu")
    config = replace(api_config, engine=engine)
    source = tmp_path / "embeddings.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"e{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"model": EMBEDDING_MODEL, "input": text, "encoding_format": fmt},
                }
            )
            + "\n"
            for i, (text, fmt) in enumerate([("first text", "float"), (["a", "b"], "base64")])
        )
    )
    output = completed_output(config, serve, source, "/v1/embeddings")
    assert sorted(output) == ["e0", "e1"]
    for custom_id, count in (("e0", 1), ("e1", 2)):
        body = sdk_line(output[custom_id])
        assert isinstance(body, CreateEmbeddingResponse)
        assert [len(item.embedding) for item in body.data] == [384] * count
