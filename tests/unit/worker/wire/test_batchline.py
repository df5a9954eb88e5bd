"""worker.wire.batchline and worker.wire.validation: batch lines in."""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any

import pytest
from msgspec import structs

from worker.errors import ErrorCode, RequestError
from worker.wire.batchline import parse_line, request_to_line
from worker.wire.messages import ChatMessage, InferenceRequest, ResponseFormat, SamplingParams
from worker.wire.validation import validate_request


def make_line(body: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "custom_id": "c-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **(body or {})},
    }
    line.update(top)
    return line


def parse_error(line: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_line(line)
    return info.value


def test_parses_a_chat_line_with_every_supported_field() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_completion_tokens": 32,
        "temperature": 0,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "stop": "END",
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "enable_thinking": False,
        "metadata": {"a": "body", "b": "body"},
        "n": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        "user": "u-1",
        "stream": False,
        "tools": [],
        "tool_choice": "none",
    }
    line = make_line(body, metadata={"a": "top"}, priority=2, deadline=1.5, batch_id="b-1")
    req = parse_line(json.dumps(line).encode())
    assert req.messages == (ChatMessage("system", "Be brief."), ChatMessage("user", "a\nb"))
    assert req.sampling == SamplingParams(
        max_tokens=32,
        temperature=0.0,
        top_p=0.9,
        top_k=40,
        seed=7,
        stop=("END",),
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        n=3,
        logprobs=True,
        top_logprobs=2,
        response_format=ResponseFormat("json_schema", "{}", "s"),
    )
    assert req.enable_thinking is False
    assert dict(req.metadata) == {"a": "top", "b": "body"}
    assert (req.model, req.priority, req.deadline, req.batch_id) == ("m", 2, 1.5, "b-1")


def test_parses_completions_lines_with_a_prompt_or_token_ids() -> None:
    text = {"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
    assert parse_line(text).prompt == "x"
    ids = {**text, "body": {"prompt": [1, 2, 3], "max_tokens": 4}}
    req = parse_line(ids)
    assert (req.prompt, req.prompt_token_ids, req.sampling.max_tokens) == (None, (1, 2, 3), 4)


def test_null_means_absent_and_thinking_may_come_from_template_kwargs() -> None:
    body = {"temperature": None, "stop": None, "chat_template_kwargs": {"enable_thinking": True}}
    req = parse_line(make_line(body, metadata=None))
    assert req.sampling == SamplingParams()
    assert req.enable_thinking is True


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1, 2]",
        '{"custom_id": "c", "body": {"temperature": NaN}}',
        "[" * 100_000,
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "", "method": "POST", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": 5, "method": "POST", "url": "/v1/chat/completions", "body": {}},
    ],
)
def test_lines_without_a_usable_custom_id_are_4001(line: Any) -> None:
    error = parse_error(line)
    assert (error.code, error.custom_id) == (ErrorCode.MALFORMED, None)


@pytest.mark.parametrize(
    "line",
    [
        {k: v for k, v in make_line().items() if k != "method"},
        {k: v for k, v in make_line().items() if k != "body"},
        {**make_line(), "body": "text"},
        make_line({"messages": None}),
        make_line({"messages": "Hi"}),
        make_line({"messages": ["Hi"]}),
        make_line({"messages": [{"content": "Hi"}]}),
        make_line({"messages": [{"role": "user", "content": None}]}),
        make_line({"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        make_line({"temperature": "0.5"}),
        make_line({"max_tokens": True}),
        make_line({"max_tokens": 1.5}),
        make_line({"stop": [1]}),
        make_line({"enable_thinking": "no"}),
        make_line(metadata={"n": 1}),
        make_line(priority="high"),
        {**make_line(url="/v1/completions"), "body": {"prompt": ["a", "b"]}},
    ],
)
def test_malformed_lines_are_4001_with_their_custom_id(line: Any) -> None:
    error = parse_error(line)
    assert (error.code, error.custom_id) == (ErrorCode.MALFORMED, "c-1")


@pytest.mark.parametrize(
    "line",
    [
        make_line(method="GET"),
        make_line(url="/v1/embeddings"),
        make_line({"n": 0}),
        make_line({"n": 129}),
        make_line({"top_logprobs": 2}),
        make_line({"logprobs": True, "top_logprobs": 21}),
        make_line({"stream": True}),
        make_line({"tools": [{"type": "function"}]}),
        make_line({"response_format": {"type": "xml"}}),
        {**make_line(url="/v1/completions"), "body": {"prompt": "x", "logprobs": 6}},
        make_line({"max_tokens": 8, "max_completion_tokens": 16}),
        make_line({"messages": []}),
        make_line({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        make_line({"temperature": 10**400}),
        make_line({"temperature": -0.5}),
    ],
)
def test_unsupported_values_are_4002_with_their_custom_id(line: Any) -> None:
    error = parse_error(line)
    assert (error.code, error.custom_id) == (ErrorCode.INVALID_PARAMETER, "c-1")


BASE = InferenceRequest("v-1", messages=(ChatMessage("user", "Hi"),))


@pytest.mark.parametrize(
    "changes",
    [
        {"sampling": SamplingParams(temperature=-0.1)},
        {"sampling": SamplingParams(temperature=2.5)},
        {"sampling": SamplingParams(temperature=math.nan)},
        {"sampling": SamplingParams(top_p=0.0)},
        {"sampling": SamplingParams(top_p=1.5)},
        {"sampling": SamplingParams(top_k=-1)},
        {"sampling": SamplingParams(max_tokens=0)},
        {"sampling": SamplingParams(max_tokens=2**31)},
        {"sampling": SamplingParams(seed=2**63)},
        {"sampling": SamplingParams(presence_penalty=2.5)},
        {"sampling": SamplingParams(frequency_penalty=-3.0)},
        {"sampling": SamplingParams(repetition_penalty=0.0)},
        {"sampling": SamplingParams(repetition_penalty=math.inf)},
        {"sampling": SamplingParams(stop=("",))},
        {"sampling": SamplingParams(stop=tuple("abcdefghijklmnopq"))},
        {"messages": ()},
        {"prompt": "also a prompt"},
        {"messages": (ChatMessage("robot", "Hi"),)},
        {"messages": (), "prompt_token_ids": (1, -2)},
        {"batch_total": -1},
        {"priority": 2**31},
        {"deadline": -1.0},
        {"submitted_at": math.inf},
    ],
)
def test_values_out_of_range_are_4002(changes: dict[str, Any]) -> None:
    req = structs.replace(BASE, **changes)
    with pytest.raises(RequestError) as info:
        validate_request(req)
    assert (info.value.code, info.value.custom_id) == (ErrorCode.INVALID_PARAMETER, "v-1")


def test_values_at_the_edges_of_their_ranges_are_accepted() -> None:
    for sampling in (
        SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_tokens=1, seed=-(2**63)),
        SamplingParams(temperature=2.0, presence_penalty=-2.0, frequency_penalty=2.0),
        SamplingParams(stop=tuple("abcdefghijklmnop"), repetition_penalty=1e-9),
    ):
        validate_request(InferenceRequest("v-1", prompt="", sampling=sampling))


def test_request_to_line_is_the_inverse_of_parse_line() -> None:
    req = InferenceRequest(
        "t-1",
        prompt_token_ids=(5, 6),
        sampling=SamplingParams(max_tokens=3, stop=("x",)),
        metadata=MappingProxyType({"k": "v"}),
        batch_total=2,
    )
    line = request_to_line(req)
    assert line["url"] == "/v1/completions" and line["body"]["prompt"] == [5, 6]
    assert parse_line(json.dumps(line)) == req
