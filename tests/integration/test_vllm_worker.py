"""The worker with ``engine.kind: vllm`` (SmolLM2 on the CPU) on the embedded broker:
requests fed in flight, each answered exactly once, one over the token budget failed
alone, and the request fields vllm maps (n, logprobs, response_format) through the whole
pipeline. One model load."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from tests.integration.harness import publish, read_results, running_worker, wait_for_lag_zero
from tests.unit.conftest import VLLM_TEST_BATCHING
from worker.config import Config
from worker.wire.messages import ChatMessage, InferenceRequest, ResponseFormat, SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.model]

QUESTIONS = ("name a color", "who wrote hamlet", "what is two plus two", "name a fruit")
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}}
GUIDE = ResponseFormat("json_schema", json.dumps(SCHEMA), "colour", True)


def chat(i: int, text: str, max_tokens: int = 8, **sampling: Any) -> InferenceRequest:
    return InferenceRequest(
        custom_id=f"req-{i}",
        messages=(ChatMessage("user", text),),
        sampling=SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, **sampling}),
        metadata={"row": str(i)},
        submitted_at=time.time(),
    )


def test_a_vllm_worker_answers_every_request_once(kafka_config: Config) -> None:
    config = replace(
        kafka_config,
        engine=replace(kafka_config.engine, kind="vllm"),
        batching=replace(VLLM_TEST_BATCHING, timeout_ms=50),
    )
    requests = [chat(i, QUESTIONS[i % len(QUESTIONS)]) for i in range(8)]
    # over the token budget (max_batch_tokens 1024): 4003, the rest unharmed
    too_long = chat(8, "word " * 1100)
    choices = chat(9, "name a color", n=2, logprobs=True, top_logprobs=2, temperature=0.8, seed=3)
    guided = chat(10, "pick a colour", max_tokens=40, response_format=GUIDE)
    everything = [*requests, too_long, choices, guided]
    published = publish(config, everything)
    with running_worker(config):
        wait_for_lag_zero(config, published.ends, timeout_s=900)
    # every request committed with its answer, the worker stopped: the topic is complete
    results = read_results(config, len(everything))
    by_id = {r.custom_id: r for r in results}
    assert len(results) == len(by_id) == len(everything)  # each answered exactly once
    for i in range(len(requests)):
        r = by_id[f"req-{i}"]
        assert r.status == "completed", r.error
        assert r.text and dict(r.metadata) == {"row": str(i)}
        assert 0 < r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
        assert r.model == config.engine.model
    # the same question, greedy, gives the same answer however the requests were in flight
    for i in range(len(QUESTIONS), len(requests)):
        assert by_id[f"req-{i}"].text == by_id[f"req-{i % len(QUESTIONS)}"].text
    assert max(r.batch_size for r in results) > 1  # requests shared the engine
    failed = by_id["req-8"]
    assert failed.status != "completed" and failed.error is not None
    assert failed.error.code == 4003
    two = by_id["req-9"]
    assert two.status == "completed" and len(two.choices) == 2
    assert all(c.logprobs and all(len(t.top) == 2 for t in c.logprobs) for c in two.choices)
    answer = by_id["req-10"]
    assert answer.status == "completed", answer.error
    if answer.finish_reason == "stop":
        jsonschema.validate(json.loads(answer.text), SCHEMA)
    else:  # cut at max_tokens: still the object's beginning
        assert answer.text.startswith("{")
