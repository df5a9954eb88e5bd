"""worker.wire.answers: every output and error line parses with the openai SDK's types."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tests.openai_sdk import (
    BatchError,
    ChatCompletion,
    Completion,
    ErrorObject,
    sdk_line,
    sdk_parse,
)
from worker.errors import ErrorCode
from worker.wire.answers import format_error_line, format_output_line, format_result_line
from worker.wire.messages import ErrorInfo, InferenceResult, Usage

CHAT = InferenceResult(
    "o-1",
    batch_id="b",
    metadata=MappingProxyType({"k": "v"}),
    text="Rome.",
    finish_reason="length",
    usage=Usage(prompt_tokens=10, completion_tokens=3, reasoning_tokens=1),
    model="m",
    created_at=1_700_000_000.9,
)
TEXT = InferenceResult("o-2", text="upon a time", usage=Usage(4, 3), endpoint="completions")


def test_chat_output_line_is_an_sdk_chat_completion() -> None:
    line = format_output_line(CHAT)
    assert line["id"] == CHAT.result_id and line["custom_id"] == "o-1"
    assert line["error"] is None and line["metadata"] == {"k": "v"}
    assert line["response"]["status_code"] == 200
    body = sdk_line(line)
    assert isinstance(body, ChatCompletion)
    assert (body.object, body.created, body.model) == ("chat.completion", 1700000000, "m")
    assert body.id.startswith("chatcmpl-")
    [choice] = body.choices
    assert (choice.index, choice.finish_reason) == (0, "length")
    assert (choice.message.role, choice.message.content) == ("assistant", "Rome.")
    assert body.usage is not None and body.usage.completion_tokens_details is not None
    assert (body.usage.prompt_tokens, body.usage.completion_tokens) == (10, 3)
    assert (body.usage.total_tokens, body.usage.completion_tokens_details.reasoning_tokens) == (
        13,
        1,
    )


def test_completions_output_line_is_an_sdk_text_completion() -> None:
    body = sdk_line(format_output_line(TEXT))
    assert isinstance(body, Completion)
    assert body.object == "text_completion" and body.id.startswith("cmpl-")
    [choice] = body.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, "upon a time", "stop")
    with pytest.raises(ValueError):  # and it is not a chat completion
        sdk_parse(ChatCompletion, format_output_line(TEXT)["response"]["body"])


def test_duplicates_share_their_ids() -> None:
    line = format_output_line(CHAT)
    again = format_output_line(InferenceResult("o-1", batch_id="b", created_at=5.0))
    assert again["id"] == line["id"]
    assert again["response"]["request_id"] == line["response"]["request_id"]
    assert again["response"]["body"]["id"] == line["response"]["body"]["id"]


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_lines_are_sdk_error_objects(code: ErrorCode) -> None:
    failed = InferenceResult(
        "e-1",
        status="failed",
        finish_reason="error",
        error=ErrorInfo(int(code), "why", "temperature"),
        endpoint="completions",
    )
    line = format_result_line(failed)
    client = code < 5000
    assert line["response"]["status_code"] == (400 if client else 500)
    body = sdk_line(line)
    assert isinstance(body, ErrorObject)
    assert (body.code, body.message, body.param) == (str(int(code)), "why", "temperature")
    assert body.type == ("invalid_request_error" if client else "server_error")
    batch_error = sdk_parse(BatchError, line["error"])
    assert (batch_error.code, batch_error.message, batch_error.param) == (
        str(int(code)),
        "why",
        "temperature",
    )


def test_an_error_without_a_field_has_a_null_param() -> None:
    failed = InferenceResult("e-2", status="failed", error=ErrorInfo(5000, "engine failed"))
    line = format_error_line(failed)
    assert line["error"]["param"] is None and line["response"]["body"]["error"]["param"] is None


def test_the_result_line_of_a_completed_result_is_its_output_line() -> None:
    assert format_result_line(CHAT) == format_output_line(CHAT)


def test_error_line_needs_an_error() -> None:
    with pytest.raises(ValueError):
        format_error_line(InferenceResult("e-3", status="failed"))


def test_strict_parsing_catches_what_a_lax_reader_lets_through() -> None:
    body = format_output_line(CHAT)["response"]["body"]
    with pytest.raises(ValueError):
        sdk_parse(ChatCompletion, {**body, "created": "1700000000"})
    with pytest.raises(AssertionError, match="invented"):
        sdk_parse(ChatCompletion, {**body, "invented": 1})
