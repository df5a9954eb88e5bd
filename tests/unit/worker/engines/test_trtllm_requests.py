"""n, logprobs and response_format on the trtllm engine, through the stand-in ``tensorrt_llm``.

What is checked is the mapping onto TensorRT-LLM's API as read from its sources (see
worker/engines/trtllm/mapping.py): the stand-in records what the engine asks for and
compiles a json guide strictly but cannot constrain its answer, so whether TensorRT-LLM's
xgrammar backend keeps an answer inside its schema was NOT run here (no GPU).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.unit.conftest import resolved
from tests.unit.worker.engines.test_structured import SCHEMAS, fmt
from tests.unit.worker.engines.test_trtllm_inflight import drain, words
from worker.engines.base import Capacity, EngineInput
from worker.engines.trtllm import TrtLlmEngine
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import ChatMessage, InferenceRequest, ResponseFormat, SamplingParams


def run(engine: TrtLlmEngine, key: str, text: str, **sampling: Any) -> Any:
    engine.submit(EngineInput(key, words(engine, text), resolved(**sampling)))
    return drain(engine, {key})[key]


def test_load_names_xgrammar_as_the_guided_decoding_backend(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    _, llm = fake_trtllm
    assert llm.args["guided_decoding_backend"] == "xgrammar"


@pytest.mark.parametrize(
    ("response_format", "guide"),
    [
        (fmt(SCHEMAS[1]), json.dumps(SCHEMAS[1])),
        # json_object as the object schema: TensorRT-LLM's own JSON guide takes any value
        (ResponseFormat("json_object"), '{"type": "object"}'),
    ],
)
def test_a_response_format_becomes_a_json_guide(
    fake_trtllm: tuple[TrtLlmEngine, Any], response_format: ResponseFormat, guide: str
) -> None:
    engine, llm = fake_trtllm
    run(engine, "g", "red blue", max_tokens=4, response_format=response_format)
    run(engine, "free", "red blue", max_tokens=4)
    (_, guided), (_, free) = llm.requests[-2:]
    assert guided.guided_decoding.json == guide
    assert not guided.guided_decoding.json_object and guided.guided_decoding.regex is None
    assert free.guided_decoding is None


def test_a_schema_xgrammar_cannot_compile_is_refused_at_admission(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    bad = fmt({"type": "integer", "minimum": 5, "maximum": 1})
    request = InferenceRequest(
        "bad", messages=(ChatMessage("user", "red"),), sampling=SamplingParams(response_format=bad)
    )
    with pytest.raises(RequestError) as info:
        engine.encode(request)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")
    assert "minimum greater than maximum" in info.value.message
    assert llm.requests == []


def test_n_choices_run_as_n_requests_seeded_seed_plus_i(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    # the seed is drawn at admission (a request's own seed is refused on this engine:
    # TorchSampler of 1.2.x ignores it); each choice still goes with seed + i
    engine, llm = fake_trtllm
    done = run(engine, "n", "sun moon star", n=3, temperature=0.7, max_tokens=2)
    sent = llm.requests[-3:]
    first = sent[0][1].seed
    assert [params.seed for _, params in sent] == [first, first + 1, first + 2]
    assert {params.n for _, params in sent} == {1}
    assert len([done.text, *(c.text for c in done.extra_choices)]) == 3
    assert done.completion_tokens == 3 * 2 and done.prompt_tokens == 3


def test_greedy_n_choices_are_not_refused(fake_trtllm: tuple[TrtLlmEngine, Any]) -> None:
    # TensorRT-LLM's SamplingParams(n=2) refuses greedy decoding; two requests of one do not
    engine, _ = fake_trtllm
    done = run(engine, "g", "sun moon", n=2, temperature=0.0, max_tokens=3)
    assert done.error is None and len(done.extra_choices) == 1
    assert done.extra_choices[0].text == done.text


def test_capacity_counts_every_choice(fake_trtllm: tuple[TrtLlmEngine, Any]) -> None:
    engine, llm = fake_trtllm
    llm.executor.hold()
    prompt = words(engine, "red blue green")
    engine.submit(EngineInput("a", prompt, resolved(max_tokens=5, n=2, temperature=1.0)))
    assert engine.capacity() == Capacity(sequences=2, tokens=64 - 2 * (3 + 5))
    llm.executor.release()
    drain(engine, {"a"})
    assert engine.capacity() == Capacity(sequences=4, tokens=64)


def test_logprobs_cover_the_answers_tokens_with_the_top_alternatives(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    done = run(engine, "lp", "sun moon", max_tokens=8, logprobs=True, top_logprobs=3)
    assert llm.requests[-1][1].logprobs == 3
    assert done.finish_reason == "stop" and done.completion_tokens == 3  # two words + end
    assert done.logprobs is not None
    # the end token is not part of the answer: no entry for it
    assert [t.token for t in done.logprobs] == ["moon", "sun"]
    for token in done.logprobs:
        assert token.logprob == pytest.approx(math.log(0.5))
        expected = [math.log(0.5**rank) for rank in (1, 2, 3)]
        assert [t.logprob for t in token.top] == pytest.approx(expected)
        assert token.top[0].token == token.token


def test_logprobs_without_alternatives_still_ask_for_the_chosen_tokens(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    done = run(engine, "lp", "sun moon", max_tokens=1, logprobs=True)
    assert llm.requests[-1][1].logprobs == 1  # logprobs=0 would ask for none
    assert done.logprobs is not None and len(done.logprobs) == 1
    assert done.logprobs[0].token == "moon" and done.logprobs[0].top == ()
    assert run(engine, "none", "sun moon", max_tokens=1).logprobs is None
