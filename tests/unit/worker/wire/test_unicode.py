"""Text that UTF-8 cannot carry (lone surrogates, valid in JSON as ``\\ud800``) is a bad
request, answered or dead-lettered — never an exception that stops the worker."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import ErrorCode, RequestError
from worker.wire.codec import (
    CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    CodecLimits,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from worker.wire.messages import ErrorInfo, InferenceResult

LIMITS = CodecLimits(max_message_bytes=1 << 20, max_decompressed_bytes=1 << 20)
HEADERS = [(CONTENT_TYPE, JSON_CONTENT_TYPE.encode())]
LONE = "\ud800"


def line(custom_id: Any = "ok-1", **top: Any) -> dict[str, Any]:
    body = top.pop("body", {"messages": [{"role": "user", "content": "hi"}]})
    doc: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
    }
    doc.update(top)
    return doc


def decode(doc: dict[str, Any]) -> Any:
    # json.dumps writes a lone surrogate as the escape \ud800: valid JSON, as a client sends it
    return decode_request(json.dumps(doc).encode(), HEADERS, LIMITS)


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def answer(err: RequestError) -> InferenceResult:
    assert err.custom_id is not None
    return InferenceResult(
        custom_id=err.custom_id,
        status="failed",
        finish_reason="error",
        error=ErrorInfo(int(err.code), err.message),
    )


def test_a_lone_surrogate_in_custom_id_is_answered_4001_under_its_escaped_form() -> None:
    with pytest.raises(RequestError) as caught:
        decode(line(f"a{LONE}"))
    err = caught.value
    assert err.code == ErrorCode.MALFORMED
    assert err.custom_id == "a\\ud800"
    assert "custom_id" in err.message
    value, _ = encode_result(answer(err))
    assert decode_result(value, None).custom_id == "a\\ud800"


def test_the_escaped_custom_id_is_kept_whatever_else_is_wrong() -> None:
    # method is checked after custom_id: the raw id must never reach an answer
    with pytest.raises(RequestError) as caught:
        decode(line(f"a{LONE}", method="GET"))
    assert caught.value.custom_id == "a\\ud800"


@pytest.mark.parametrize(
    ("top", "field"),
    [
        ({"metadata": {f"k{LONE}": "v"}}, "metadata"),
        ({"metadata": {"k": f"v{LONE}"}}, "metadata"),
        ({"body": {"messages": [{"role": "user", "content": f"hi{LONE}"}]}}, "content"),
        (
            {"body": {"messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]}},
            "content",
        ),
        (
            {"body": {"messages": [{"role": "user", "content": "hi"}], "stop": [f"x{LONE}"]}},
            "stop",
        ),
        ({"body": {"messages": [{"role": "user", "content": "hi"}], "model": LONE}}, "model"),
        ({"batch_id": f"b{LONE}"}, "batch_id"),
        ({"url": "/v1/completions", "body": {"prompt": f"p{LONE}"}}, "prompt"),
    ],
)
def test_a_lone_surrogate_anywhere_else_is_4001_naming_the_field(
    top: dict[str, Any], field: str
) -> None:
    with pytest.raises(RequestError) as caught:
        decode(line("ok-1", **top))
    err = caught.value
    assert (err.code, err.custom_id) == (ErrorCode.MALFORMED, "ok-1")
    assert field in err.message
    assert utf8(err.message)
    encode_result(answer(err))


def test_without_a_custom_id_it_is_dead_lettered() -> None:
    doc = line(metadata={"k": LONE})
    del doc["custom_id"]
    with pytest.raises(RequestError) as caught:
        decode(doc)
    assert caught.value.custom_id is None


def test_encode_result_escapes_what_utf8_cannot_carry_in_every_string_field() -> None:
    result = InferenceResult(
        custom_id=f"c{LONE}",
        batch_id=f"b{LONE}",
        metadata=MappingProxyType({f"k{LONE}": f"v{LONE}"}),
        status="failed",
        text=f"t{LONE}",
        finish_reason="error",
        error=ErrorInfo(4001, f"m{LONE}"),
        model=f"model{LONE}",
        worker_id=f"w{LONE}",
    )
    value, headers = encode_result(result)
    assert isinstance(value, bytes)
    back = decode_result(value, headers)
    assert (back.custom_id, back.batch_id, back.text) == ("c\\ud800", "b\\ud800", "t\\ud800")
    assert dict(back.metadata) == {"k\\ud800": "v\\ud800"}
    assert back.error == ErrorInfo(4001, "m\\ud800")
    assert (back.model, back.worker_id) == ("model\\ud800", "w\\ud800")


@settings(max_examples=300, deadline=None)
@given(
    custom_id=st.text(),
    metadata=st.dictionaries(st.text(), st.text(), max_size=3),
    content=st.text(),
)
def test_any_text_decodes_to_an_encodable_request_or_a_request_error(
    custom_id: str, metadata: dict[str, str], content: str
) -> None:
    doc = line(
        custom_id,
        metadata=metadata,
        body={"messages": [{"role": "user", "content": content}]},
    )
    try:
        req = decode(doc)
    except RequestError as err:
        assert utf8(err.message)
        if err.custom_id is not None:
            encode_result(answer(err))
        return
    encode_request(req)
    encode_result(InferenceResult(custom_id=req.custom_id, metadata=req.metadata, text=content))
