"""decode_request reads a protobuf request field by field only where it is set, its
headers in one pass, and skips the surrogate search (issue 42). Fuzzed against a
reference decode written here the plain way — every field asked for by name, each header
looked up on its own, every string searched — for any message, bytes and headers: the
same request or the same error (code, message, custom_id, param, batch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import zstandard
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.errors import ErrorCode, RequestError
from worker.wire._generated.batchpipe.v1 import inference_pb2 as pb
from worker.wire.batchline import parse_line
from worker.wire.codec import (
    REQUEST_CONTENT_TYPE,
    REQUEST_TYPE,
    CodecLimits,
    Headers,
    _unknown_fields,  # naming unknown fields is not what changed
    decode_request,
)
from worker.wire.compression import ZSTD_MAGIC, inflate
from worker.wire.messages import (
    ChatMessage,
    InferenceRequest,
    ResponseFormat,
    SamplingParams,
)
from worker.wire.validation import INT32_MAX, ROLES, escaped, validate_request

LIMITS = CodecLimits(max_message_bytes=4096, max_decompressed_bytes=8192)
INT32 = st.integers(-INT32_MAX - 1, INT32_MAX)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
TEXT = st.text(max_size=6)
FORMATS = ("", "text", "json_object", "json_schema", "xml")
SCHEMAS = ("", "{}", '{"type": "object"}', "not json", "[]")
ENDPOINTS = {
    pb.ENDPOINT_CHAT_COMPLETIONS: "chat",
    pb.ENDPOINT_COMPLETIONS: "completions",
    pb.ENDPOINT_EMBEDDINGS: "embeddings",
    pb.ENDPOINT_RESPONSES: "responses",
}


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def messages(draw: st.DrawFn) -> pb.InferenceRequest:
    """Any InferenceRequest: each field set or not, in range or not."""
    msg = pb.InferenceRequest(
        custom_id=draw(TEXT),
        batch_id=draw(TEXT),
        batch_total=draw(INT32),
        model=draw(st.sampled_from(["", "m", "other"])),
        metadata=draw(st.dictionaries(TEXT, TEXT, max_size=2)),
        priority=draw(INT32),
    )
    # enums are open in proto3: a value this worker does not know arrives as a number
    msg.encoding_format = draw(st.integers(0, 3))  # type: ignore[assignment]
    msg.endpoint = draw(st.integers(0, 5))  # type: ignore[assignment]
    for name, strategy in (
        ("enable_thinking", st.booleans()),
        ("deadline", FLOATS),
        ("submitted_at", FLOATS),
        ("dimensions", INT32),
    ):
        value = draw(_optional(strategy))
        if value is not None:
            setattr(msg, name, value)
    kind = draw(st.sampled_from(["none", "messages", "prompt", "ids", "texts"]))
    if kind == "messages":
        roles = st.sampled_from([*sorted(ROLES), "robot"])
        for role, content in draw(st.lists(st.tuples(roles, TEXT), max_size=3)):
            msg.messages.items.add(role=role, content=content)
        msg.messages.SetInParent()
    elif kind == "prompt":
        msg.prompt = draw(TEXT)
    elif kind == "ids":
        msg.prompt_token_ids.ids.extend(draw(st.lists(INT32, max_size=3)))
        msg.prompt_token_ids.SetInParent()
    elif kind == "texts":
        msg.embedding_inputs.texts.extend(draw(st.lists(TEXT, max_size=3)))
        msg.embedding_inputs.SetInParent()
    if draw(st.booleans()):
        _sampling(draw, msg.sampling)
    return msg


def _sampling(draw: st.DrawFn, s: pb.SamplingParams) -> None:
    s.SetInParent()
    for name, strategy in (
        ("max_tokens", INT32),
        ("temperature", FLOATS),
        ("top_p", FLOATS),
        ("top_k", INT32),
        ("seed", st.integers(-(2**63), 2**63 - 1)),
        ("presence_penalty", FLOATS),
        ("frequency_penalty", FLOATS),
        ("repetition_penalty", FLOATS),
        ("n", INT32),
        ("logprobs", st.booleans()),
        ("top_logprobs", INT32),
    ):
        value = draw(_optional(strategy))
        if value is not None:
            setattr(s, name, value)
    s.stop.extend(draw(st.lists(TEXT, max_size=2)))
    if draw(st.booleans()):
        f = s.response_format
        f.SetInParent()
        f.type = draw(st.sampled_from(FORMATS))
        f.schema = draw(st.sampled_from(SCHEMAS))
        f.name = draw(st.sampled_from(["", "n"]))
        strict = draw(_optional(st.booleans()))
        if strict is not None:
            f.strict = strict


@st.composite
def values(draw: st.DrawFn) -> bytes | None:
    """A record value: a message (as it is, with an unknown field, cut short, or its
    bytes changed), JSON, any bytes, or none; compressed or not."""
    raw = draw(messages()).SerializeToString()
    form = draw(st.sampled_from(["as is", "unknown", "cut", "flipped", "json", "any", "none"]))
    if form == "none":
        return None
    if form == "unknown":
        raw += b"\xa0\x06\x01"  # field 100, varint 1
    elif form == "cut" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif form == "flipped" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    elif form == "json":
        raw = draw(st.sampled_from([b'{"custom_id": "j", "body": {}}', b" {", b"{}"]))
    elif form == "any":
        raw = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        return zstandard.ZstdCompressor(write_content_size=draw(st.booleans())).compress(raw)
    return raw


NAMES = st.sampled_from(["content-type", "Content-Type", "content-encoding", "CONTENT-ENCODING"])
HEADER_VALUES = st.sampled_from(
    [
        None,
        REQUEST_CONTENT_TYPE,
        REQUEST_CONTENT_TYPE.encode(),
        "application/protobuf",
        ' Application/X-Protobuf ; TYPE="batchpipe.v1.InferenceRequest"',
        "application/x-protobuf; type=other.Type",
        "application/json",
        "text/plain",
        "zstd",
        b"ZSTD ",
        "identity",
        "",
        "gzip",
        b"\xff\xfe",
        "x-other",
    ]
)


@st.composite
def headers(draw: st.DrawFn) -> Headers | None:
    pairs = draw(st.lists(st.tuples(NAMES | st.just("x-other"), HEADER_VALUES), max_size=4))
    shape = draw(st.sampled_from(["none", "list", "dict"]))
    if shape == "none":
        return None
    return dict(pairs) if shape == "dict" else pairs


# -- the reference: the plain way --------------------------------------------------------


def _last(headers: Headers | None, name: str) -> str | None:
    pairs: Sequence[tuple[str, Any]] = list(
        headers.items() if isinstance(headers, Mapping) else headers or []
    )
    found = [v for k, v in pairs if k.lower() == name and v is not None]
    if not found:
        return None
    value = found[-1]
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _reference_payload(value: bytes | None, headers: Headers | None) -> bytes:
    if value is None:
        raise RequestError(ErrorCode.MALFORMED, "the record has no value")
    if len(value) > LIMITS.max_message_bytes:
        raise RequestError(
            ErrorCode.OVER_LIMIT,
            f"the value is {len(value)} bytes, limit {LIMITS.max_message_bytes}",
        )
    encoding = _last(headers, "content-encoding")
    if encoding is None:
        encoding = "zstd" if value[:4] == ZSTD_MAGIC else "identity"
    encoding = encoding.strip().lower()
    if encoding == "zstd":
        return inflate(value, LIMITS.max_decompressed_bytes)
    if encoding not in ("identity", ""):
        raise RequestError(
            ErrorCode.MALFORMED, f"unsupported content-encoding {encoding!r}; use zstd"
        )
    return value


def _reference_is_json(payload: bytes, headers: Headers | None) -> bool:
    content_type = _last(headers, "content-type")
    if content_type is None:
        return payload.lstrip().startswith(b"{")
    media, *params = [part.strip() for part in content_type.split(";")]
    named = {}
    for param in params:
        key, _, value = param.partition("=")
        named[key.strip().lower()] = value.strip().strip('"')
    if media.lower() == "application/json":
        return True
    protobuf = media.lower() in ("application/x-protobuf", "application/protobuf")
    if protobuf and named.get("type", REQUEST_TYPE) == REQUEST_TYPE:
        return False
    raise RequestError(
        ErrorCode.MALFORMED,
        f"unsupported content-type {content_type!r}; use 'application/json' "
        f"or 'application/x-protobuf; type={REQUEST_TYPE}'",
    )


def _asked(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _reference_request(msg: pb.InferenceRequest) -> InferenceRequest:
    s, f = msg.sampling, msg.sampling.response_format
    kinds = {"": "text", "text": "text", "json_object": "json_object", "json_schema": "json_schema"}
    if f.type not in kinds:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"response_format.type must be text, json_object or json_schema, got {f.type!r}",
            param="response_format",
        )
    encodings = {0: "float", 1: "float", 2: "base64"}
    if msg.encoding_format not in encodings:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"encoding_format must be float or base64, got enum value {msg.encoding_format}",
            param="encoding_format",
        )
    which = msg.WhichOneof("input")
    optional = ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty")
    more = ("frequency_penalty", "repetition_penalty", "n", "logprobs", "top_logprobs")
    req = InferenceRequest(
        custom_id=msg.custom_id,
        batch_id=msg.batch_id,
        batch_total=msg.batch_total,
        model=msg.model,
        messages=tuple(ChatMessage(m.role, m.content) for m in msg.messages.items),
        prompt=msg.prompt if which == "prompt" else None,
        prompt_token_ids=tuple(msg.prompt_token_ids.ids),
        sampling=SamplingParams(
            **{name: _asked(s, name) for name in optional + more},
            stop=tuple(s.stop),
            response_format=ResponseFormat(
                kinds[f.type],  # type: ignore[arg-type]
                f.schema,
                f.name,
                _asked(f, "strict"),
            ),
        ),
        enable_thinking=_asked(msg, "enable_thinking"),
        metadata=MappingProxyType(dict(msg.metadata)),
        priority=msg.priority,
        deadline=_asked(msg, "deadline"),
        submitted_at=_asked(msg, "submitted_at"),
        embedding_inputs=tuple(msg.embedding_inputs.texts),
        encoding_format=encodings[msg.encoding_format],  # type: ignore[arg-type]
        dimensions=_asked(msg, "dimensions"),
        responses=msg.endpoint == pb.ENDPOINT_RESPONSES,
    )
    said = ENDPOINTS.get(msg.endpoint)
    if msg.endpoint and said != req.endpoint:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"endpoint {said or msg.endpoint!r} does not match the request's input "
            f"({req.endpoint})",
            param="endpoint",
        )
    return req


def reference(value: bytes | None, headers: Headers | None) -> InferenceRequest:
    payload = _reference_payload(value, headers)
    if _reference_is_json(payload, headers):
        return parse_line(payload)
    try:
        msg = pb.InferenceRequest.FromString(payload)
    except DecodeError as exc:
        raise RequestError(
            ErrorCode.MALFORMED, f"not a valid protobuf {REQUEST_TYPE}: {exc}"
        ) from exc
    custom_id = msg.custom_id or None
    try:  # every error from here on is answered in the request's batch
        if unknown := _unknown_fields(msg, ""):
            named = ", ".join(unknown)
            problem = f"unknown {REQUEST_TYPE} field number(s) {named}: this worker cannot "
            raise RequestError(
                ErrorCode.INVALID_PARAMETER, problem + "honour them", param=unknown[0]
            )
        req = _reference_request(msg)
        validate_request(req)  # every string searched for a lone surrogate too
    except RequestError as exc:
        batch_id, total = escaped(msg.batch_id), max(0, msg.batch_total)
        answer_to = exc.custom_id or custom_id
        error = RequestError(exc.code, exc.message, answer_to, param=exc.param)
        raise error.in_batch(batch_id, total) from exc
    return req


def _outcome(value: bytes | None, headers: Headers | None, decode: Any) -> object:
    try:
        return decode(value, headers)
    except RequestError as exc:
        return (exc.code, exc.message, exc.custom_id, exc.param, exc.batch_id, exc.batch_total)


@settings(max_examples=600, deadline=None)
@given(values(), headers())
def test_any_record_decodes_as_the_plain_reading_does(
    value: bytes | None, headers: Headers | None
) -> None:
    ours = _outcome(value, headers, lambda v, h: decode_request(v, h, LIMITS))
    assert ours == _outcome(value, headers, reference)


@settings(max_examples=300, deadline=None)
@given(messages())
def test_any_message_decodes_as_the_plain_reading_does(msg: pb.InferenceRequest) -> None:
    value, headers = msg.SerializeToString(), [("content-type", REQUEST_CONTENT_TYPE)]
    ours = _outcome(value, headers, lambda v, h: decode_request(v, h, LIMITS))
    assert ours == _outcome(value, headers, reference)
