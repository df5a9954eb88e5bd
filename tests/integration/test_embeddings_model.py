"""An embeddings batch file end to end: submitted and collected with the Client on the
embedded broker, answered by a worker serving all-MiniLM-L6-v2 through vLLM's pooling
runner on the CPU. Every output line reads as the SDK's ``CreateEmbeddingResponse``, and
every vector matches the model's own (transformers, computed apart) to cosine ≥ 0.999."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpipe import Client
from tests.embedding_reference import cosine, reference_vectors
from tests.integration.harness import running_worker
from tests.openai_sdk import CreateEmbeddingResponse, sdk_line
from worker.config import Config, EngineConfig
from worker.known_models import EMBEDDING_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.model]

TEXTS = [
    "A batch of texts to embed.",
    "Kafka carries the requests; the worker answers each one exactly once.",
    "short",
    "Similar sentences have similar vectors.",
    "Ünïcode text is embedded too: 東京",
]


def line(custom_id: str, body: dict[str, Any]) -> str:
    row = {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}
    return json.dumps(row, ensure_ascii=False) + "\n"


def test_an_embeddings_file_through_submit_and_collect(
    kafka_config: Config, tmp_path: Path
) -> None:
    engine = EngineConfig(kind="vllm", model=EMBEDDING_MODEL, task="embed", device="cpu")
    config = replace(kafka_config, engine=engine)
    source = tmp_path / "embeddings.jsonl"
    source.write_text(
        line("one", {"model": EMBEDDING_MODEL, "input": TEXTS[0]})
        + line("many", {"model": EMBEDDING_MODEL, "input": TEXTS[1:4], "user": "u-1"})
        + line("b64", {"model": EMBEDDING_MODEL, "input": [TEXTS[4]], "encoding_format": "base64"})
        + line("dims", {"model": EMBEDDING_MODEL, "input": "x", "dimensions": 128})
    )
    client = Client(config)
    with running_worker(config):
        receipt = client.submit_file(source)
        # the worker loads vLLM and the model on a shared CPU first
        status = client.collect(
            receipt.batch_id, tmp_path / "out.jsonl", tmp_path / "err.jsonl", timeout_s=600
        )
    assert (status.completed, status.failed) == (3, 1)
    errors = [json.loads(x) for x in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["code"], e["error"]["param"]) for e in errors] == [
        ("dims", "4002", "dimensions")
    ]
    reference = dict(zip(TEXTS, reference_vectors(TEXTS), strict=True))
    wanted = {"one": TEXTS[:1], "many": TEXTS[1:4], "b64": TEXTS[4:]}
    for raw in (tmp_path / "out.jsonl").read_text().splitlines():
        output = json.loads(raw)
        body = sdk_line(output)
        assert isinstance(body, CreateEmbeddingResponse)
        assert body.model == EMBEDDING_MODEL
        assert body.usage.prompt_tokens == body.usage.total_tokens > 0
        texts = wanted.pop(output["custom_id"])
        assert [item.index for item in body.data] == list(range(len(texts)))
        for item, text in zip(body.data, texts, strict=True):
            assert len(item.embedding) == 384
            assert cosine(item.embedding, reference[text]) >= 0.999
    assert not wanted
