"""/v1/responses lines (issue 26): parsed into chat messages and sampling, refused by
name where the API or batchpipe does not take them, carried by protobuf, answered as a
``response`` the openai SDK's ``Response`` reads (every field of the table is walked
against the parser by test_fields.py)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from msgspec import structs

from tests.openai_sdk import Response, sdk_line
from worker.config import BatchingConfig, GenerationConfig
from worker.engines.echo import EchoEngine
from worker.errors import ErrorCode, RequestError
from worker.loop.intake import Intake, Rejection
from worker.loop.jobs import Identity, Source
from worker.wire.answers import format_error_line, format_output_line
from worker.wire.batchline import parse_line, request_to_line
from worker.wire.codec import CodecLimits, decode_request, encode_request
from worker.wire.compression import compress, inflate
from worker.wire.messages import (
    ChatMessage,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    ResponseFormat,
    SamplingParams,
    Usage,
)

LIMITS = CodecLimits(1 << 20, 1 << 20)
#: InferenceRequest.endpoint's enum values (proto/batchpipe/v1/inference.proto)
CHAT, COMPLETIONS, RESPONSES = 1, 2, 4


def with_endpoint(req: InferenceRequest, endpoint: int) -> tuple[bytes, None]:
    """``req`` as protobuf with field 17 (``endpoint``) set to ``endpoint`` by hand, as
    another producer could send it."""
    value, _ = encode_request(req)
    return compress(inflate(value, 1 << 20) + bytes([0x88, 0x01, endpoint])), None


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def line(**body: Any) -> dict[str, Any]:
    return {
        "custom_id": "r-1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "m", "input": "hi", **body},
    }


def refused(request: dict[str, Any], code: ErrorCode = ErrorCode.INVALID_PARAMETER) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_line(request)
    assert info.value.code == code, info.value.message
    assert info.value.custom_id == "r-1"
    return info.value


def test_a_string_input_is_one_user_message() -> None:
    req = parse_line(line())
    assert req.endpoint == "responses" and req.responses
    assert req.messages == (ChatMessage("user", "hi"),)
    assert req.sampling == SamplingParams()


def test_instructions_and_message_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "terse"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "b", "annotations": []}],
        },
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "c"}, {"type": "input_text", "text": "d"}],
        },
    ]
    req = parse_line(line(input=items, instructions="Be brief."))
    assert req.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("developer", "terse"),
        ChatMessage("user", "a"),
        ChatMessage("assistant", "b"),
        ChatMessage("user", "c\nd"),
    )


def test_settings_metadata_and_text_format() -> None:
    fmt = {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}
    req = parse_line(
        {
            **line(
                max_output_tokens=7,
                temperature=0.5,
                top_p=0.9,
                text={"format": fmt},
                metadata={"a": "1"},
                store=False,
                user="u",
            ),
            "metadata": {"b": "2"},
        }
    )
    assert (req.sampling.max_tokens, req.sampling.temperature, req.sampling.top_p) == (7, 0.5, 0.9)
    assert req.sampling.response_format == ResponseFormat(
        "json_schema", json.dumps(SCHEMA), "n", True
    )
    assert dict(req.metadata) == {"a": "1", "b": "2"}
    plain = parse_line(line(text={"format": {"type": "json_object"}}))
    assert plain.sampling.response_format == ResponseFormat("json_object")
    assert parse_line(line(text={"format": {"type": "text"}})).sampling == SamplingParams()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stop": ["x"]}, "stop"),  # the Responses API has no stop
        ({"n": 2}, "n"),
        ({"seed": 1}, "seed"),
        ({"max_tokens": 5}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"enable_thinking": False}, "enable_thinking"),
        ({"tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"text": {"verbosity": "low"}}, "text"),
        ({"text": {"format": {"type": "xml"}}}, "text"),
        ({"text": {"format": {"type": "json_schema", "name": "n", "extra": 1}}}, "text"),
        ({"text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": 5}}}}, "text"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input",
        ),
        ({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}, "input"),
        ({"input": [{"role": "user", "content": "x", "id": "msg_1"}]}, "id"),
    ],
)
def test_what_it_does_not_take_is_4002_naming_the_field(body: dict[str, Any], param: str) -> None:
    error = refused(line(**body))
    assert error.param == param, error.message


@pytest.mark.parametrize(
    "body",
    [
        {"input": None},
        {"input": []},
        {"input": 5},
        {"input": ["just a string"]},
        {"input": [{"role": "user", "content": 5}]},
        {"instructions": 3},
        {"max_output_tokens": "7"},
        {"text": "json"},
    ],
)
def test_a_wrong_type_is_4001(body: dict[str, Any]) -> None:
    refused(line(**body), ErrorCode.MALFORMED)


def test_a_line_round_trips_through_json_and_protobuf() -> None:
    fmt = {"type": "json_schema", "name": "n", "schema": SCHEMA}
    req = parse_line(
        {
            **line(instructions="sys", max_output_tokens=9, top_p=0.5, text={"format": fmt}),
            "metadata": {"k": "v"},
            "priority": 2,
        }
    )
    assert parse_line(request_to_line(req)) == req
    assert request_to_line(req)["url"] == "/v1/responses"
    assert decode_request(*encode_request(req), LIMITS) == req


def test_protobuf_holds_only_what_a_responses_body_can_say() -> None:
    base = InferenceRequest("r-1", messages=(ChatMessage("user", "hi"),), responses=True)
    with pytest.raises(RequestError) as info:
        decode_request(
            *encode_request(structs.replace(base, sampling=SamplingParams(stop=("x",)))), LIMITS
        )
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "stop")
    with pytest.raises(RequestError) as info:
        decode_request(
            *encode_request(structs.replace(base, messages=(ChatMessage("tool", "x"),))), LIMITS
        )
    assert info.value.param == "input"
    # a responses request without messages, or an endpoint the input contradicts
    prompt = InferenceRequest("r-1", prompt="x")
    with pytest.raises(RequestError) as info:
        decode_request(*with_endpoint(prompt, RESPONSES), LIMITS)
    assert info.value.param == "input"
    chat = structs.replace(base, responses=False)
    with pytest.raises(RequestError) as info:
        decode_request(*with_endpoint(chat, COMPLETIONS), LIMITS)
    assert info.value.param == "endpoint"
    assert decode_request(*with_endpoint(chat, CHAT), LIMITS) == chat  # the one it has


RESULT = InferenceResult(
    "r-1",
    batch_id="b",
    metadata=MappingProxyType({"k": "v"}),
    text='{"n": 1}',
    usage=Usage(prompt_tokens=12, completion_tokens=5, reasoning_tokens=0),
    model="m",
    created_at=1_700_000_000.5,
    endpoint="responses",
)


def test_a_completed_answer_is_an_sdk_response() -> None:
    body = sdk_line(format_output_line(RESULT))
    assert isinstance(body, Response)
    assert body.id.startswith("resp_") and body.object == "response"
    assert (body.status, body.incomplete_details, body.model) == ("completed", None, "m")
    assert body.created_at == 1_700_000_000 and body.metadata == {"k": "v"}
    assert body.output_text == '{"n": 1}'
    [message] = body.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")  # type: ignore[union-attr]
    assert body.usage is not None
    assert (body.usage.input_tokens, body.usage.output_tokens, body.usage.total_tokens) == (
        12,
        5,
        17,
    )
    assert body.tools == [] and body.error is None


def test_an_answer_cut_by_length_is_incomplete() -> None:
    body = sdk_line(format_output_line(structs.replace(RESULT, finish_reason="length")))
    assert isinstance(body, Response)
    assert body.status == "incomplete"
    assert body.incomplete_details is not None
    assert body.incomplete_details.reason == "max_output_tokens"
    assert body.output[0].status == "incomplete"  # type: ignore[union-attr]


def test_a_failed_responses_request_is_an_error_line() -> None:
    failed = structs.replace(RESULT, status="failed", error=ErrorInfo(4002, "no", "text"))
    assert format_error_line(failed)["response"]["body"]["error"]["param"] == "text"


class Plain(EchoEngine):
    """An engine that honours no optional field."""

    honours = frozenset()
    inert = frozenset()


def test_admission_names_the_responses_field_an_engine_refuses() -> None:
    """A structured-output format the engine does not honour is 4002 naming ``text``, the
    field the line set, not the internal ``response_format``."""
    engine = Plain()
    intake = Intake(
        engine,
        Identity("w", engine.model_name),
        BatchingConfig(),
        GenerationConfig(),
        LIMITS,
    )
    request = parse_line(line(model="", text={"format": {"type": "json_object"}}))
    outcome = intake.take(Source("t", 0, 0), *encode_request(request), 0.0)
    assert isinstance(outcome, Rejection) and outcome.result.error is not None
    assert (outcome.result.error.code, outcome.result.error.param) == (4002, "text")
    assert outcome.result.endpoint == "responses"
