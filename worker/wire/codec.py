"""Kafka record values and headers <-> domain objects (docs/architecture.md §4).

A request record is a zstd frame of a serialised ``batchpipe.v1.InferenceRequest``, or
one OpenAI/Bailian batch line as JSON (zstd-compressed or not); a result record is a
zstd frame of a serialised ``batchpipe.v1.InferenceResult``. This is the only module
that touches the generated protobuf code.

Decoding never trusts the input: the value's size is checked before anything else and
decompression is bounded (:mod:`worker.wire.compression`). Every failure is a
:class:`~worker.errors.RequestError` carrying the ``custom_id`` when one was recovered.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet
from msgspec import structs

from worker.config import LimitsConfig
from worker.errors import ErrorCode, RequestError
from worker.wire._generated.batchpipe.v1 import inference_pb2 as pb
from worker.wire.batchline import parse_line
from worker.wire.compression import ZSTD_MAGIC, compress, inflate
from worker.wire.messages import (
    SETTINGS_KEPT_BYTES,
    ChatMessage,
    Choice,
    EncodingFormat,
    Endpoint,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    InferenceResult,
    Logprobs,
    ResponseFormat,
    ResponseFormatType,
    SamplingParams,
    Status,
    Timings,
    TokenLogprob,
    Usage,
    remember,
)
from worker.wire.validation import escaped
from worker.wire.validation import validate_request as validate_request  # re-exported

CONTENT_TYPE = "content-type"
CONTENT_ENCODING = "content-encoding"
REQUEST_TYPE = "batchpipe.v1.InferenceRequest"
RESULT_TYPE = "batchpipe.v1.InferenceResult"
REQUEST_CONTENT_TYPE = f"application/x-protobuf; type={REQUEST_TYPE}"
RESULT_CONTENT_TYPE = f"application/x-protobuf; type={RESULT_TYPE}"
JSON_CONTENT_TYPE = "application/json"
ZSTD_ENCODING = "zstd"
PROTOBUF_MEDIA_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})

HeaderValue = bytes | str | None
#: Kafka record headers as confluent-kafka gives them: a list of pairs (a dict when produced)
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue]

_STATUS: dict[Status, pb.Status] = {"completed": pb.STATUS_COMPLETED, "failed": pb.STATUS_FAILED}
_FINISH: dict[FinishReason, pb.FinishReason] = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "error": pb.FINISH_REASON_ERROR,
    "content_filter": pb.FINISH_REASON_CONTENT_FILTER,
}
_ENDPOINT: dict[Endpoint, pb.Endpoint] = {
    "chat": pb.ENDPOINT_CHAT_COMPLETIONS,
    "completions": pb.ENDPOINT_COMPLETIONS,
    "embeddings": pb.ENDPOINT_EMBEDDINGS,
    "responses": pb.ENDPOINT_RESPONSES,
}
_ENCODING: dict[EncodingFormat, pb.EncodingFormat] = {
    "float": pb.ENCODING_FORMAT_FLOAT,
    "base64": pb.ENCODING_FORMAT_BASE64,
}
_STATUS_NAME = {number: name for name, number in _STATUS.items()}
_FINISH_NAME = {number: name for name, number in _FINISH.items()}
_ENDPOINT_NAME = {number: name for name, number in _ENDPOINT.items()}
_ENCODING_NAME: dict[int, EncodingFormat] = {
    pb.ENCODING_FORMAT_UNSPECIFIED: "float",
    **{number: name for name, number in _ENCODING.items()},
}


@dataclass(frozen=True)
class CodecLimits:
    """Bounds on one record: its value's size, and its size once decompressed."""

    max_message_bytes: int
    max_decompressed_bytes: int

    @classmethod
    def from_config(cls, limits: LimitsConfig) -> CodecLimits:
        return cls(limits.max_message_bytes, limits.max_decompressed_bytes)


def _malformed(message: str, custom_id: str | None = None) -> RequestError:
    return RequestError(ErrorCode.MALFORMED, message, custom_id)


def _content_headers(headers: Headers | None) -> tuple[str | None, str | None]:
    """``(content-type, content-encoding)``: the last value of each (names matched
    case-insensitively) as text, None when absent; the headers are read once for both."""
    content_type: HeaderValue = None
    encoding: HeaderValue = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        if value is None:
            continue
        name = key.lower()
        if name == CONTENT_TYPE:
            content_type = value
        elif name == CONTENT_ENCODING:
            encoding = value
    return _text(content_type), _text(encoding)


def _text(value: HeaderValue) -> str | None:
    return value if value is None or isinstance(value, str) else value.decode("utf-8", "replace")


def _payload(value: bytes | None, encoding: str | None, limits: CodecLimits) -> bytes:
    """The record's value with its content-encoding undone, within ``limits``."""
    if value is None:
        raise _malformed("the record has no value")
    if len(value) > limits.max_message_bytes:
        raise RequestError(
            ErrorCode.OVER_LIMIT,
            f"the value is {len(value)} bytes, limit {limits.max_message_bytes}",
        )
    if encoding is None:
        encoding = ZSTD_ENCODING if value.startswith(ZSTD_MAGIC) else "identity"
    encoding = encoding.strip().lower()
    if encoding == ZSTD_ENCODING:
        return inflate(value, limits.max_decompressed_bytes)
    if encoding in ("identity", ""):
        return value
    raise _malformed(f"unsupported content-encoding {encoding!r}; use zstd")


def _is_json(payload: bytes, content_type: str | None, message_type: str) -> bool:
    if content_type is None:
        return payload.lstrip()[:1] == b"{"
    if len(content_type) > _MEDIA_KEPT_CHARS:  # a tenant's long header: read, not kept
        return _media_is_json(content_type, message_type)
    return _json_media(content_type, message_type)


def _media_is_json(content_type: str, message_type: str) -> bool:
    media, *params = (part.strip() for part in content_type.split(";"))
    media = media.lower()
    named = {
        k.strip().lower(): v.strip().strip('"') for k, _, v in (p.partition("=") for p in params)
    }
    if media == JSON_CONTENT_TYPE:
        return True
    if media in PROTOBUF_MEDIA_TYPES and named.get("type", message_type) == message_type:
        return False
    raise _malformed(
        f"unsupported content-type {content_type!r}; use {JSON_CONTENT_TYPE!r} "
        f"or 'application/x-protobuf; type={message_type}'"
    )


#: the most characters of a content-type :func:`_json_media` keeps: a valid one can carry
#: parameters of any length, and the cache would keep them after their records are answered
_MEDIA_KEPT_CHARS = 256
#: :func:`_media_is_json` of the same few content-types on every record, read once
_json_media = functools.lru_cache(maxsize=64)(_media_is_json)


def _set_fields(msg: Message) -> dict[str, Any]:
    """The fields of ``msg`` that are set, by name: a proto3 ``optional`` field is there
    exactly when it is set (as :func:`_present` says), a plain one when not its default."""
    return {descriptor.name: value for descriptor, value in msg.ListFields()}


def _present(msg: Any, name: str) -> Any:
    """A proto3 ``optional`` field's value, or None when unset."""
    return getattr(msg, name) if msg.HasField(name) else None


def _request_to_pb(req: InferenceRequest) -> pb.InferenceRequest:
    s = req.sampling
    msg = pb.InferenceRequest(
        custom_id=req.custom_id,
        batch_id=req.batch_id,
        batch_total=req.batch_total,
        model=req.model,
        sampling=pb.SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=s.seed,
            stop=s.stop,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            n=s.n,
            logprobs=s.logprobs,
            top_logprobs=s.top_logprobs,
            response_format=_format_to_pb(s.response_format),
        ),
        enable_thinking=req.enable_thinking,
        metadata=req.metadata,
        priority=req.priority,
        deadline=req.deadline,
        submitted_at=req.submitted_at,
        encoding_format=_ENCODING[req.encoding_format],
        dimensions=req.dimensions,
        # only /v1/responses needs saying: every other endpoint follows from the input
        endpoint=pb.ENDPOINT_RESPONSES if req.responses else pb.ENDPOINT_UNSPECIFIED,
    )
    # Setting a oneof member selects it; the last one set would win, so set only one.
    if req.messages:
        msg.messages.items.extend(
            pb.ChatMessage(role=m.role, content=m.content) for m in req.messages
        )
    elif req.prompt is not None:
        msg.prompt = req.prompt
    elif req.prompt_token_ids:
        msg.prompt_token_ids.ids.extend(req.prompt_token_ids)
    elif req.embedding_inputs:
        msg.embedding_inputs.texts.extend(req.embedding_inputs)
    return msg


def _format_to_pb(fmt: ResponseFormat) -> pb.ResponseFormat | None:
    if fmt == ResponseFormat():
        return None
    return pb.ResponseFormat(type=fmt.type, schema=fmt.schema, name=fmt.name, strict=fmt.strict)


def _format_from_pb(msg: pb.ResponseFormat) -> ResponseFormat:
    kinds: dict[str, ResponseFormatType] = {
        "": "text",
        "text": "text",
        "json_object": "json_object",
        "json_schema": "json_schema",
    }
    kind = kinds.get(msg.type)
    if kind is None:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"response_format.type must be text, json_object or json_schema, got {msg.type!r}",
            param="response_format",
        )
    return ResponseFormat(kind, msg.schema, msg.name, _present(msg, "strict"))


def _has_unknown(msg: Message) -> bool:
    """Whether ``msg`` holds unknown fields anywhere: what it serializes to shrinks when
    they are dropped. Two C calls, where naming them (:func:`_unknown_fields`) walks every
    nested message in Python; that runs only when this says there is something to name.
    ``msg`` loses its unknown fields here."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return msg.ByteSize() != size


def _unknown_fields(msg: Message, where: str) -> list[str]:
    """Fields a newer producer set that this worker does not know, by path and number."""
    unknown = UnknownFieldSet(msg)
    found = [f"{where}{unknown[i].field_number}" for i in range(len(unknown))]
    for descriptor, value in msg.ListFields():
        if descriptor.message_type is None or descriptor.message_type.GetOptions().map_entry:
            continue
        children = value if descriptor.is_repeated else [value]
        for child in children:
            found += _unknown_fields(child, f"{where}{descriptor.name}.")
    return found


def _encoding_from_pb(number: int) -> EncodingFormat:
    encoding = _ENCODING_NAME.get(number)
    if encoding is None:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"encoding_format must be float or base64, got enum value {number}",
            param="encoding_format",
        )
    return encoding


#: what a request that sets no sampling field, or no response_format, reads as
_UNSET_SAMPLING = SamplingParams()
_UNSET_FORMAT = ResponseFormat()
_NO_METADATA: Mapping[str, str] = MappingProxyType({})


def _request_from_pb(msg: pb.InferenceRequest) -> InferenceRequest:
    # Only what is set is read: one C call lists it (ListFields), and a field not listed
    # has its default, so no wrapper is made for an unset sub-message (each costs about
    # as much as reading a field), and the input is read from its oneof member alone.
    top = _set_fields(msg)
    which = msg.WhichOneof("input")
    sampling = top.get("sampling")
    metadata = top.get("metadata")
    endpoint = top.get("endpoint", pb.ENDPOINT_UNSPECIFIED)
    req = InferenceRequest(
        custom_id=top.get("custom_id", ""),
        batch_id=top.get("batch_id", ""),
        batch_total=top.get("batch_total", 0),
        model=top.get("model", ""),
        messages=tuple(ChatMessage(m.role, m.content) for m in msg.messages.items)
        if which == "messages"
        else (),
        prompt=msg.prompt if which == "prompt" else None,
        prompt_token_ids=tuple(msg.prompt_token_ids.ids) if which == "prompt_token_ids" else (),
        sampling=_UNSET_SAMPLING if sampling is None else _sampling_of(sampling),
        enable_thinking=top.get("enable_thinking"),
        metadata=_NO_METADATA if metadata is None else MappingProxyType(dict(metadata)),
        priority=top.get("priority", 0),
        deadline=top.get("deadline"),
        submitted_at=top.get("submitted_at"),
        embedding_inputs=tuple(msg.embedding_inputs.texts) if which == "embedding_inputs" else (),
        encoding_format=_encoding_from_pb(top.get("encoding_format", 0)),
        dimensions=top.get("dimensions"),
        responses=endpoint == pb.ENDPOINT_RESPONSES,
    )
    said = _ENDPOINT_NAME.get(endpoint)
    if endpoint != pb.ENDPOINT_UNSPECIFIED and said != req.endpoint:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"endpoint {said or endpoint!r} does not match the request's input ({req.endpoint})",
            param="endpoint",
        )
    return req


#: decoded settings by their message's bytes: most requests of a batch ask for the same, so
#: each is read once (and is one object, which admission's table of resolved settings finds
#: by identity); a message over :data:`SETTINGS_KEPT_BYTES` (a long schema) is not kept
_SAMPLINGS: dict[bytes, SamplingParams] = {}
_SAMPLINGS_KEPT = 256


def _sampling_of(msg: pb.SamplingParams) -> SamplingParams:
    """``msg`` decoded; the same bytes give the same (shared, frozen) value."""
    key = msg.SerializeToString()  # parsing these bytes gives msg again: same key, same value
    known = _SAMPLINGS.get(key)
    if known is None:
        known = _sampling_from_pb(msg)
        if len(key) <= SETTINGS_KEPT_BYTES:
            remember(_SAMPLINGS, key, known, _SAMPLINGS_KEPT)
    return known


def _sampling_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    asked = _set_fields(msg)
    fmt = asked.get("response_format")
    return SamplingParams(
        max_tokens=asked.get("max_tokens"),
        temperature=asked.get("temperature"),
        top_p=asked.get("top_p"),
        top_k=asked.get("top_k"),
        seed=asked.get("seed"),
        stop=tuple(asked.get("stop", ())),
        presence_penalty=asked.get("presence_penalty"),
        frequency_penalty=asked.get("frequency_penalty"),
        repetition_penalty=asked.get("repetition_penalty"),
        n=asked.get("n"),
        logprobs=asked.get("logprobs"),
        top_logprobs=asked.get("top_logprobs"),
        response_format=_UNSET_FORMAT if fmt is None else _format_from_pb(fmt),
    )


def encode_request(req: InferenceRequest) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value (a zstd frame declaring its size) and headers for ``req``.

    ``req`` should have passed :func:`validate_request`: if it holds more than one input,
    only the first of messages, prompt, token ids is sent; integers beyond the protobuf
    field ranges raise ``ValueError``.
    """
    value = compress(_request_to_pb(req).SerializeToString())
    return value, [
        (CONTENT_TYPE, REQUEST_CONTENT_TYPE.encode()),
        (CONTENT_ENCODING, ZSTD_ENCODING.encode()),
    ]


def decode_request(
    value: bytes | None, headers: Headers | None, limits: CodecLimits
) -> InferenceRequest:
    """The validated request in a record, or :class:`RequestError` 4001/4002/4003.

    Without headers the encoding is sniffed (zstd magic number) and so is the type
    (a leading ``{`` is a JSON batch line, anything else protobuf).
    """
    content_type, encoding = _content_headers(headers)
    payload = _payload(value, encoding, limits)
    if _is_json(payload, content_type, REQUEST_TYPE):
        return parse_line(payload)
    msg = pb.InferenceRequest()
    try:
        msg.ParseFromString(payload)
    except DecodeError as exc:
        raise _malformed(f"not a valid protobuf {REQUEST_TYPE}: {exc}") from exc
    custom_id = msg.custom_id or None
    batch = (escaped(msg.batch_id), max(0, msg.batch_total))  # puts an error in its batch
    unknown: list[str] = []
    if _has_unknown(msg):  # which: named from the record as it came (msg lost them)
        unknown = _unknown_fields(pb.InferenceRequest.FromString(payload), "")
    if unknown:
        # proto3 keeps fields it does not know; serving the request without them would
        # silently ignore what the producer asked for
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"unknown {REQUEST_TYPE} field number(s) {', '.join(unknown)}: this worker "
            "cannot honour them",
            custom_id,
            param=unknown[0],
        ).in_batch(*batch)
    try:
        req = _request_from_pb(msg)
    except RequestError as exc:
        error = RequestError(exc.code, exc.message, custom_id, param=exc.param)
        raise error.in_batch(*batch) from exc
    try:
        # parsing found every string field valid UTF-8 (a lone surrogate is not): a
        # DecodeError above, so no string here can hold one
        validate_request(req, utf8=True, shared=True)  # settings: _sampling_of's
    except RequestError as exc:
        raise exc.in_batch(*batch) from exc
    return req


def encode_result(res: InferenceResult) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value (a zstd frame declaring its size) and headers for ``res``.

    Never raises for text: a string that UTF-8 cannot encode goes out escaped.
    """
    try:
        msg = _result_to_pb(res)
    except UnicodeEncodeError:
        # Decoding refuses such text (validate_request), so only a bug gets here; one bad
        # string must not stop the worker and leave its record to be re-read forever.
        msg = _result_to_pb(_escaped(res))
    return compress(msg.SerializeToString()), list(_RESULT_HEADERS)


#: the headers of every result record, encoded once
_RESULT_HEADERS = (
    (CONTENT_TYPE, RESULT_CONTENT_TYPE.encode()),
    (CONTENT_ENCODING, ZSTD_ENCODING.encode()),
)


def _escaped(res: InferenceResult) -> InferenceResult:
    """``res`` with every string made encodable as UTF-8."""
    error = res.error
    return structs.replace(
        res,
        custom_id=escaped(res.custom_id),
        batch_id=escaped(res.batch_id),
        metadata=MappingProxyType({escaped(k): escaped(v) for k, v in res.metadata.items()}),
        text=escaped(res.text),
        error=None
        if error is None
        else ErrorInfo(error.code, escaped(error.message), escaped(error.param)),
        model=escaped(res.model),
        worker_id=escaped(res.worker_id),
        logprobs=_escaped_logprobs(res.logprobs),
        extra_choices=tuple(
            Choice(escaped(c.text), c.finish_reason, _escaped_logprobs(c.logprobs))
            for c in res.extra_choices
        ),
    )


def _escaped_logprobs(logprobs: Logprobs) -> Logprobs:
    def one(token: TokenLogprob) -> TokenLogprob:
        return TokenLogprob(escaped(token.token), token.logprob, tuple(map(one, token.top)))

    return None if logprobs is None else tuple(map(one, logprobs))


def _result_to_pb(res: InferenceResult) -> pb.InferenceResult:
    # Sub-messages are filled in place, and what is empty is left unset (as the constructor
    # leaves an empty list or map): a pb.Usage or pb.Timings built apart and passed in is
    # copied again, about twice the time of this for a plain completion.
    msg = pb.InferenceResult(
        custom_id=res.custom_id,
        batch_id=res.batch_id,
        batch_total=res.batch_total,
        status=_STATUS[res.status],
        text=res.text,
        finish_reason=_FINISH[res.finish_reason],
        batch_size=res.batch_size,
        model=res.model,
        worker_id=res.worker_id,
        created_at=res.created_at,
        endpoint=_ENDPOINT[res.endpoint],
        encoding_format=_ENCODING[res.encoding_format],
    )
    if res.metadata:
        msg.metadata.update(res.metadata)
    usage, timings = res.usage, res.timings
    into = msg.usage
    into.SetInParent()  # present even when every count is 0, as it always was
    into.prompt_tokens = usage.prompt_tokens
    into.completion_tokens = usage.completion_tokens
    into.reasoning_tokens = usage.reasoning_tokens
    spent = msg.timings
    spent.SetInParent()
    spent.queued_s = timings.queued_s
    spent.batch_wait_s = timings.batch_wait_s
    spent.engine_s = timings.engine_s
    if res.logprobs is not None:
        _logprobs_into(msg.logprobs, res.logprobs)
    for c in res.extra_choices:
        choice = msg.extra_choices.add(text=c.text, finish_reason=_FINISH[c.finish_reason])
        if c.logprobs is not None:
            _logprobs_into(choice.logprobs, c.logprobs)
    if res.embeddings:
        msg.embeddings.extend(pb.Embedding(values=vector) for vector in res.embeddings)
    if res.error is not None:
        msg.error.code = res.error.code
        msg.error.message = res.error.message
        msg.error.param = res.error.param
    return msg


def _logprobs_into(msg: pb.Logprobs, logprobs: tuple[TokenLogprob, ...]) -> None:
    msg.SetInParent()  # present for an empty list too: the request asked for logprobs
    msg.content.extend(_token_to_pb(t) for t in logprobs)


def _token_to_pb(token: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token=token.token, logprob=token.logprob, top_logprobs=[_token_to_pb(t) for t in token.top]
    )


def _token_from_pb(msg: pb.TokenLogprob) -> TokenLogprob:
    return TokenLogprob(msg.token, msg.logprob, tuple(_token_from_pb(t) for t in msg.top_logprobs))


def _logprobs_from_pb(holder: Any) -> Logprobs:
    if not holder.HasField("logprobs"):
        return None
    return tuple(_token_from_pb(t) for t in holder.logprobs.content)


def decode_result(
    value: bytes | None, headers: Headers | None, limits: CodecLimits | None = None
) -> InferenceResult:
    """The result in a record; :class:`RequestError` 4001/4003 if it holds none.

    A failed result always carries an error and a completed one never does.
    """
    content_type, encoding = _content_headers(headers)
    payload = _payload(value, encoding, limits or CodecLimits.from_config(LimitsConfig()))
    if _is_json(payload, content_type, RESULT_TYPE):
        raise _malformed(f"results are protobuf {RESULT_TYPE}, not JSON")
    msg = pb.InferenceResult()
    try:
        msg.ParseFromString(payload)
    except DecodeError as exc:
        raise _malformed(f"not a valid protobuf {RESULT_TYPE}: {exc}") from exc
    custom_id = msg.custom_id or None
    status = _STATUS_NAME.get(msg.status)
    finish_reason = _FINISH_NAME.get(msg.finish_reason)
    if status is None or finish_reason is None:
        raise _malformed("result without a valid status and finish_reason", custom_id)
    if (status == "failed") != msg.HasField("error"):
        raise _malformed("a result carries an error exactly when it failed", custom_id)
    return InferenceResult(
        custom_id=msg.custom_id,
        batch_id=msg.batch_id,
        batch_total=msg.batch_total,
        metadata=MappingProxyType(dict(msg.metadata)),
        status=status,
        text=msg.text,
        finish_reason=finish_reason,
        usage=Usage(
            msg.usage.prompt_tokens, msg.usage.completion_tokens, msg.usage.reasoning_tokens
        ),
        error=ErrorInfo(msg.error.code, msg.error.message, msg.error.param)
        if msg.HasField("error")
        else None,
        timings=Timings(msg.timings.queued_s, msg.timings.batch_wait_s, msg.timings.engine_s),
        batch_size=msg.batch_size,
        model=msg.model,
        worker_id=msg.worker_id,
        created_at=msg.created_at,
        endpoint=_ENDPOINT_NAME.get(msg.endpoint, "chat"),
        logprobs=_logprobs_from_pb(msg),
        extra_choices=tuple(
            Choice(c.text, _FINISH_NAME.get(c.finish_reason, "stop"), _logprobs_from_pb(c))
            for c in msg.extra_choices
        ),
        embeddings=tuple(tuple(e.values) for e in msg.embeddings),
        encoding_format=_ENCODING_NAME.get(msg.encoding_format, "float"),
    )
