"""Two models in one fleet: a requests topic per model, one consumer group each, one
shared results topic (docs/architecture.md §4, "Models and topics").

Real ``batchpipe worker`` processes — the chat model SmolLM2 and the embedding model
all-MiniLM-L6-v2, both on the hf engine on CPU — share one fleet configuration file that
holds the routes, as the Helm chart's ConfigMap and docker-compose's ``deploy/worker.yaml``
do; each group overrides its topic, group and model. A chat file and an embeddings file are
submitted with the CLI (one routed by the file's routes, one by ``--route`` flags) and each
is collected with the CLI: every request is answered exactly once, by the model it named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchpipe.collect import open_reader, record_headers, records
from tests import ROOT
from tests.integration.fleet import fleet
from tests.integration.harness import write_config
from tests.openai_sdk import ChatCompletion, CreateEmbeddingResponse, sdk_line
from worker.config import Config, LimitsConfig
from worker.known_models import EMBEDDING_MODEL
from worker.wire.codec import CodecLimits, decode_result

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.model]

CHAT = "smollm2-135m-instruct"
ENGINES = {
    CHAT: ("engine.kind=hf", f"engine.model={CHAT}"),
    EMBEDDING_MODEL: ("engine.kind=hf", "engine.task=embed", f"engine.model={EMBEDDING_MODEL}"),
}
ANSWER_TYPES = {CHAT: ChatCompletion, EMBEDDING_MODEL: CreateEmbeddingResponse}
COLLECT_TIMEOUT_S = 300


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchpipe.cli", *args],
        capture_output=True,
        text=True,
        timeout=COLLECT_TIMEOUT_S + 60,
        cwd=ROOT,
    )


def request_body(model: str, i: int) -> tuple[str, dict[str, Any]]:
    """The url and body of request ``i``: chat for SmolLM2, embeddings for MiniLM."""
    text = f"Say the number {i}."
    if model == CHAT:
        messages = [{"role": "user", "content": text}]
        return "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 4}
    return "/v1/embeddings", {"model": model, "input": text}


def batch_file(path: Path, model: str, count: int) -> Path:
    rows = []
    for i in range(count):
        url, body = request_body(model, i)
        row = {"custom_id": f"{model}-{i}", "method": "POST", "url": url, "body": body}
        rows.append({**row, "metadata": {"n": str(i)}})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def submit(file: Path, *args: str) -> str:
    done = cli("submit", str(file), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def collect(batch_id: str, config: Path, out_dir: Path) -> list[dict[str, Any]]:
    out, errors = out_dir / f"{batch_id}.out", out_dir / f"{batch_id}.err"
    done = cli(
        "collect", "--batch-id", batch_id, "-o", str(out), "--errors", str(errors),
        "--timeout", str(COLLECT_TIMEOUT_S), "-q", "-c", str(config),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert errors.read_text() == "", "no request may fail (a 4002 would be a misrouted one)"
    return [json.loads(line) for line in out.read_text().splitlines()]


def raw_answers(config: Config) -> Counter[tuple[str, str, str]]:
    """(batch id, custom_id, model) of every record on the shared results topic."""
    limits = CodecLimits.from_config(LimitsConfig())
    consumer, partitions = open_reader(config.kafka, config.kafka.results_topic, None)
    try:
        found: Counter[tuple[str, str, str]] = Counter()
        for msg in records(consumer, partitions, until_end=True, deadline=None):
            result = decode_result(msg.value(), record_headers(msg), limits)
            found[(result.batch_id, result.custom_id, result.model)] += 1
        return found
    finally:
        consumer.close()


def test_a_chat_and_an_embedding_model_each_on_its_own_topic_and_group(
    kafka_config: Config, tmp_path: Path
) -> None:
    k = kafka_config.kafka
    topics = {CHAT: f"{k.requests_topic}-chat", EMBEDDING_MODEL: f"{k.requests_topic}-embed"}
    fleet_config = replace(kafka_config, kafka=replace(k, routes=topics))
    fleet_path = write_config(fleet_config, tmp_path / "fleet.yaml")
    plain_path = write_config(kafka_config, tmp_path / "plain.yaml")  # no routes in it

    chat_file = batch_file(tmp_path / "chat.jsonl", CHAT, 3)
    embed_file = batch_file(tmp_path / "embed.jsonl", EMBEDDING_MODEL, 5)
    with fleet(fleet_path) as workers:
        for n, (model, topic) in enumerate(topics.items()):
            group = f"kafka.group_id={k.group_id}-{n}"
            workers.start(f"kafka.requests_topic={topic}", group, *ENGINES[model])
        chat_batch = submit(chat_file, "-c", str(fleet_path))
        routes = [f"{model}={topic}" for model, topic in topics.items()]
        embed_batch = submit(
            embed_file, "-c", str(plain_path), "--route", routes[0], "--route", routes[1]
        )
        lines = {
            chat_batch: collect(chat_batch, fleet_path, tmp_path),
            embed_batch: collect(embed_batch, fleet_path, tmp_path),
        }
        workers.assert_alive()
        status = cli("status", chat_batch, "--json", "-c", str(fleet_path))
        assert status.returncode == 0, status.stderr

    expected = {chat_batch: (CHAT, 3), embed_batch: (EMBEDDING_MODEL, 5)}
    for batch_id, (model, count) in expected.items():
        got = lines[batch_id]
        assert sorted(line["custom_id"] for line in got) == sorted(
            f"{model}-{i}" for i in range(count)
        )
        for line in got:
            body = sdk_line(line)  # the endpoint's own shape, read with the openai SDK
            assert isinstance(body, ANSWER_TYPES[model]) and body.model == model
            assert line["metadata"] == {"n": line["custom_id"].rsplit("-", 1)[1]}
            if isinstance(body, CreateEmbeddingResponse):
                assert [len(item.embedding) for item in body.data] == [384]
    assert json.loads(status.stdout)["request_counts"]["completed"] == 3

    # the shared results topic holds each request's answer exactly once, from its model
    answers = raw_answers(kafka_config)
    want = {
        (batch_id, f"{model}-{i}", model): 1
        for batch_id, (model, count) in expected.items()
        for i in range(count)
    }
    assert dict(answers) == want
