"""The field table walked against the code: the SDK's field lists, the parser, admission
per engine, and docs/fields.md (issue 17 item 2: nothing silently ignored)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from openai.types import completion_create_params as text_params
from openai.types import embedding_create_params as embed_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as responses_params

from worker.config import BatchingConfig, GenerationConfig
from worker.engines import support
from worker.engines.base import Engine
from worker.engines.echo import EchoEngine
from worker.errors import ErrorCode, RequestError
from worker.loop.intake import Intake, Rejection
from worker.loop.jobs import Identity, Source
from worker.wire.batchline import parse_line
from worker.wire.codec import CodecLimits, encode_request
from worker.wire.fields import BOTH, FIELDS, body_field
from worker.wire.messages import ChatMessage, Endpoint, InferenceRequest, SamplingParams

URLS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}
ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions", "embeddings", "responses")
INPUTS: dict[Endpoint, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "completions": {"prompt": "hi"},
    "embeddings": {"input": "hi"},
    "responses": {"input": "hi"},
}
SDK_FIELDS: dict[Endpoint, set[str]] = {
    "chat": {*chat_params.CompletionCreateParamsBase.__annotations__, "stream"},
    "completions": {*text_params.CompletionCreateParamsBase.__annotations__, "stream"},
    "embeddings": {*embed_params.EmbeddingCreateParams.__annotations__},
    "responses": {*responses_params.ResponseCreateParamsBase.__annotations__, "stream"},
}
#: a value of each field that asks for something; every field of the table has one
ASKING: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "prompt": "hi",
    "input": ["hi", "there"],
    "encoding_format": "base64",
    "dimensions": 8,
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "temperature": 0.5,
    "top_p": 0.5,
    "seed": 1,
    "stop": ["x"],
    "presence_penalty": 1.0,
    "frequency_penalty": 1.0,
    "n": 2,
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
    "metadata": {"k": "v"},
    "user": "u",
    "safety_identifier": "s",
    "prompt_cache_key": "k",
    "service_tier": "flex",
    "store": True,
    "stream": True,
    "stream_options": {"include_usage": True},
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "logit_bias": {"50256": -100},
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"input": True},
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {},
    "best_of": 3,
    "echo": True,
    "suffix": "end",
    "top_k": 5,
    "repetition_penalty": 1.2,
    "enable_thinking": True,
    "chat_template_kwargs": {"enable_thinking": True},
    "instructions": "be brief",
    "max_output_tokens": 4,
    "text": {"format": {"type": "json_object"}},
    "include": ["message.output_text.logprobs"],
    "reasoning": {"effort": "high"},
    "previous_response_id": "resp_1",
    "conversation": "conv_1",
    "background": True,
    "max_tool_calls": 3,
    "truncation": "auto",
    "context_management": [{"type": "compaction"}],
    "background_options": {},
    "access_programs": {},
    "image": {},
}
#: where a name means another thing on /v1/responses: the value that asks for it there
RESPONSES_ASKING: dict[str, Any] = {
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "prompt": {"id": "pmpt_1"},
}
ids = itertools.count()


def asking(name: str, endpoint: Endpoint) -> Any:
    """A value of field ``name`` that asks for something on ``endpoint``."""
    if endpoint == "responses":
        return RESPONSES_ASKING.get(name, ASKING[name])
    return ASKING[name]


def line(endpoint: Endpoint, **body: Any) -> dict[str, Any]:
    full = {**INPUTS[endpoint], **body}
    if "top_logprobs" in body and endpoint in BOTH:
        full["logprobs"] = True  # top_logprobs needs it
    if endpoint == "completions" and full.get("logprobs") is True:
        full["logprobs"] = 2  # the completions endpoint's logprobs is a count
    return {"custom_id": f"f-{next(ids)}", "method": "POST", "url": URLS[endpoint], "body": full}


def refusal(request: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_line(request)
    assert info.value.code == ErrorCode.INVALID_PARAMETER, info.value.message
    return info.value


def test_every_field_has_an_asking_value() -> None:
    assert set(ASKING) == {field.name for field in FIELDS}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_table_lists_sdk_fields_and_refuses_the_others(endpoint: Endpoint) -> None:
    listed = {f.name for f in FIELDS if endpoint in f.endpoints}
    extensions = {f.name for f in FIELDS if f.extension}
    inputs = {"messages", "prompt", "input"}
    assert listed - extensions - inputs <= SDK_FIELDS[endpoint]
    for name in sorted(SDK_FIELDS[endpoint] - listed - inputs):
        value = asking(name, endpoint) if name in ASKING else "anything"
        error = refusal(line(endpoint, **{name: value}))
        assert error.param == name and "unknown field" in error.message


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_the_parser_does_what_the_table_says(field: Any) -> None:
    for endpoint in ENDPOINTS:
        request = line(endpoint, **{field.name: asking(field.name, endpoint)})
        # the row of this name on this endpoint (``field`` may be another endpoint's)
        found = body_field(field.name, endpoint)
        if found is None:
            assert refusal(request).param == field.name
        elif found.treatment == "refused":
            assert refusal(request).param == field.name
            for value in (None, *found.neutral):
                parse_line(line(endpoint, **{field.name: value}))
        else:
            parse_line(request)


def test_unknown_keys_anywhere_are_4002_naming_them() -> None:
    assert refusal({**line("chat"), "extra": 1}).param == "extra"
    named = line("chat", messages=[{"role": "user", "content": "hi", "name": "bob"}])
    assert refusal(named).param == "name"
    kwargs = line("chat", chat_template_kwargs={"enable_thinking": True, "tools": []})
    assert refusal(kwargs).param == "tools"
    schema = line("chat", response_format={"type": "json_schema", "json_schema": {"x": 1}})
    assert refusal(schema).param == "response_format"


class Plain(EchoEngine):
    """An engine that honours no optional field (as a new engine starts)."""

    honours = frozenset()
    inert = frozenset()


def admitted(engine: Engine, sampling: SamplingParams) -> RequestError | None:
    request = InferenceRequest(
        custom_id=f"a-{next(ids)}", messages=(ChatMessage("user", "hi"),), sampling=sampling
    )
    identity = Identity("w", engine.model_name)
    intake = Intake(
        engine, identity, BatchingConfig(), GenerationConfig(), CodecLimits(1 << 20, 1 << 20)
    )
    outcome = intake.take(Source("t", 0, next(ids)), *encode_request(request), 0.0)
    if not isinstance(outcome, Rejection):
        return None
    error = outcome.result.error
    assert error is not None and error.code == ErrorCode.INVALID_PARAMETER
    return RequestError(ErrorCode(error.code), error.message, param=error.param)


#: the engine fields of the generation endpoints (dimensions: tests/unit/worker/engines/
#: test_embed.py)
ENGINE_FIELDS = {f.name: f for f in FIELDS if f.treatment == "engine" and f.endpoints & BOTH}
SAMPLING: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 0.5},
    "top_p": {"top_p": 0.5},
    "seed": {"seed": 1},
    "stop": {"stop": ("x",)},
    "presence_penalty": {"presence_penalty": 1.0},
    "frequency_penalty": {"frequency_penalty": 1.0},
    "n": {"n": 2},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "top_k": {"top_k": 5},
    "repetition_penalty": {"repetition_penalty": 1.2},
}


@pytest.mark.parametrize("engine", [EchoEngine(), Plain()], ids=["echo", "plain"])
@pytest.mark.parametrize("name", sorted(set(ENGINE_FIELDS) - {"response_format"}))
def test_admission_refuses_exactly_the_fields_the_engine_does_not_honour(
    engine: Engine, name: str
) -> None:
    error = admitted(engine, SamplingParams(**SAMPLING[name]))
    status = support.support(ENGINE_FIELDS[name], type(engine))
    if status == "refused":
        assert error is not None and error.param in (name, "logprobs")
    else:
        assert error is None, error.message


def test_every_engine_field_has_a_sampling_example() -> None:
    assert set(SAMPLING) | {"response_format"} == set(ENGINE_FIELDS)


def test_docs_fields_table_is_rendered_from_the_code() -> None:
    text = support.DOC.read_text()
    assert support.BEGIN in text and support.END in text
    assert support.rendered(text) == text, "run: python -m worker.engines.support"
