"""OpenAI/Bailian batch file lines <-> domain objects.

Input line (``schemas/batch-input-line.schema.json``)::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "...", "messages": [...], "max_tokens": 32, ...},
     "metadata": {"k": "v"}, "priority": 0, "deadline": 1767225600.0}

``url`` is ``/v1/chat/completions`` (``messages``), ``/v1/completions`` (``prompt``,
a string or a list of token ids), ``/v1/embeddings`` (``input``, a string or a list of
strings; ``encoding_format``, ``dimensions``) or ``/v1/responses`` (``input`` and
``instructions``, run as chat messages: :mod:`worker.wire.responses`). ``metadata`` may
sit at the top level or in the body (both are merged, the top level wins). ``batch_id``,
``batch_total``, ``priority``, ``deadline`` and ``submitted_at`` are optional top-level
batchpipe extensions.

Nothing is silently ignored: a key the line, its body or a message does not define is
4002 naming it, and so is a body field batchpipe refuses (:mod:`worker.wire.fields`
lists every field and what is done with it); ``null`` means absent.

Output and error lines are written by :mod:`worker.wire.answers`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from worker.errors import ErrorCode, RequestError
from worker.wire.fields import body_field
from worker.wire.jsonfields import Fields
from worker.wire.messages import (
    ChatMessage,
    EncodingFormat,
    Endpoint,
    InferenceRequest,
    SamplingParams,
)
from worker.wire.response_format import format_from_json, format_to_json
from worker.wire.responses import (
    RESPONSES_URL,
    named_for_responses,
    responses_body,
    responses_messages,
    responses_sampling,
)
from worker.wire.validation import check_custom_id, escaped, validate_request

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
#: the endpoint each batch-line ``url`` addresses
URLS: dict[str, Endpoint] = {
    CHAT_URL: "chat",
    COMPLETIONS_URL: "completions",
    EMBEDDINGS_URL: "embeddings",
    RESPONSES_URL: "responses",
}
ENCODING_FORMATS: tuple[EncodingFormat, ...] = ("float", "base64")
_OPTIONAL_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
LINE_KEYS = frozenset(
    {"custom_id", "method", "url", "body", "metadata", "batch_id", "batch_total", "priority"}
    | {"deadline", "submitted_at"}
)
MESSAGE_KEYS = frozenset({"role", "content"})
#: the most alternatives per token the completions endpoint's integer ``logprobs`` takes
MAX_COMPLETIONS_LOGPROBS = 5


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _content(part_list: Any, fields: Fields, where: str) -> str:
    """A message's content: a string, or the text of a list of text parts."""
    if isinstance(part_list, str):
        return part_list
    if not isinstance(part_list, list):
        raise fields.error(ErrorCode.MALFORMED, f"{where} must be a string or a list of parts")
    texts = []
    for part in part_list:
        if not isinstance(part, dict):
            raise fields.error(ErrorCode.MALFORMED, f"{where} parts must be objects")
        if part.get("type") != "text":
            raise fields.error(
                ErrorCode.INVALID_PARAMETER, f"{where}: only text parts are supported"
            )
        text = Fields(part, f"{where}.", fields.custom_id).get("text", str, "a string")
        if text is None:
            raise fields.error(ErrorCode.MALFORMED, f"{where} text part has no text")
        texts.append(text)
    return "\n".join(texts)


def _messages(body: Fields) -> tuple[ChatMessage, ...]:
    raw = body.get("messages", list, "a list of messages")
    if raw is None:
        raise body.error(ErrorCode.MALFORMED, f"body.messages is required for {CHAT_URL}")
    messages = []
    for i, item in enumerate(raw):
        where = f"body.messages[{i}]"
        if not isinstance(item, dict):
            raise body.error(ErrorCode.MALFORMED, f"{where} must be an object")
        message = Fields(item, f"{where}.", body.custom_id)
        message.unknown(MESSAGE_KEYS, "a message is a role and its text content")
        role = message.get("role", str, "a string")
        if role is None:
            raise body.error(ErrorCode.MALFORMED, f"{where}.role is required")
        messages.append(ChatMessage(role, _content(item.get("content"), body, f"{where}.content")))
    return tuple(messages)


def _prompt(body: Fields) -> tuple[str | None, tuple[int, ...]]:
    raw = body.obj.get("prompt")
    if isinstance(raw, str):
        return raw, ()
    if isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return None, tuple(raw)
    raise body.error(
        ErrorCode.MALFORMED, f"body.prompt is required for {COMPLETIONS_URL}: a string or token ids"
    )


def _embedding_inputs(body: Fields) -> tuple[str, ...]:
    """``input``: a string or a list of strings. Token arrays, which OpenAI also takes, are
    refused: the tokens would have to be the served model's own."""
    raw = body.obj.get("input")
    if isinstance(raw, str):
        return (raw,)
    if raw == []:
        raise body.error(ErrorCode.INVALID_PARAMETER, "body.input holds no text", "input")
    if isinstance(raw, list) and all(isinstance(text, str) for text in raw):
        return tuple(raw)
    if isinstance(raw, list) and all(isinstance(t, int | list) for t in raw):
        raise body.error(
            ErrorCode.INVALID_PARAMETER,
            "body.input: token arrays are not supported; send the text",
            "input",
        )
    raise body.error(
        ErrorCode.MALFORMED,
        f"body.input is required for {EMBEDDINGS_URL}: a string or a list of strings",
    )


def _encoding_format(body: Fields) -> EncodingFormat:
    raw = body.get("encoding_format", str, "a string")
    for encoding in ENCODING_FORMATS:
        if raw in (None, encoding):
            return encoding
    raise body.error(
        ErrorCode.INVALID_PARAMETER,
        f"encoding_format must be float or base64, got {raw!r}",
        "encoding_format",
    )


def _envelope(custom_id: str, top: Fields, body: Fields) -> dict[str, Any]:
    """The fields every endpoint's request takes from the line's top level and ``model``."""
    return {
        "custom_id": custom_id,
        "batch_id": top.get("batch_id", str, "a string") or "",
        "batch_total": top.integer("batch_total") or 0,
        "model": body.get("model", str, "a string") or "",
        "priority": top.integer("priority") or 0,
        "deadline": top.number("deadline"),
        "submitted_at": top.number("submitted_at"),
    }


def _embeddings_request(custom_id: str, top: Fields, body: Fields) -> InferenceRequest:
    return InferenceRequest(
        **_envelope(custom_id, top, body),
        embedding_inputs=_embedding_inputs(body),
        encoding_format=_encoding_format(body),
        dimensions=body.integer("dimensions"),
        metadata=MappingProxyType(top.string_map("metadata")),
    )


def _responses_request(custom_id: str, top: Fields, body: Fields) -> InferenceRequest:
    req = InferenceRequest(
        **_envelope(custom_id, top, body),
        messages=responses_messages(body),
        sampling=responses_sampling(body),
        metadata=MappingProxyType({**body.string_map("metadata"), **top.string_map("metadata")}),
        responses=True,
    )
    try:
        validate_request(req)
    except RequestError as exc:
        raise named_for_responses(exc) from exc
    return req


def _check_body(body: Fields, endpoint: Endpoint, url: str) -> None:
    """4002 for a key ``url``'s body does not have, or a refused field that asks for something."""
    for key, value in body.obj.items():
        field = body_field(key, endpoint)
        if field is None:
            raise body.error(
                ErrorCode.INVALID_PARAMETER, f"unknown field body.{key} for {url}", key
            )
        if field.treatment == "refused" and not field.asks_nothing(value):
            raise body.error(
                ErrorCode.INVALID_PARAMETER, f"body.{key} is not supported: {field.note}", key
            )


def _logprobs(body: Fields, endpoint: Endpoint) -> tuple[bool | None, int | None]:
    """``(logprobs, top_logprobs)``: chat takes a boolean and a count, completions a count."""
    if endpoint == "chat":
        return body.get("logprobs", bool, "a boolean"), body.integer("top_logprobs")
    count = body.integer("logprobs")
    if count is not None and not 0 <= count <= MAX_COMPLETIONS_LOGPROBS:
        raise body.error(
            ErrorCode.INVALID_PARAMETER,
            f"logprobs must be between 0 and {MAX_COMPLETIONS_LOGPROBS}, got {count}",
            "logprobs",
        )
    return (None, None) if count is None else (True, count)


def _sampling(body: Fields, endpoint: Endpoint) -> SamplingParams:
    max_tokens = body.integer("max_tokens")
    max_completion_tokens = body.integer("max_completion_tokens")
    if None not in (max_tokens, max_completion_tokens) and max_tokens != max_completion_tokens:
        raise body.error(ErrorCode.INVALID_PARAMETER, "max_tokens and max_completion_tokens differ")
    stop = body.get("stop", (str, list), "a string or a list of strings")
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise body.error(ErrorCode.MALFORMED, "body.stop must be a string or a list of strings")
    floats = {name: body.number(name) for name in _OPTIONAL_FLOATS}
    logprobs, top_logprobs = _logprobs(body, endpoint)
    try:
        response_format = format_from_json(body.obj.get("response_format"))
    except RequestError as exc:
        raise body.error(exc.code, exc.message, exc.param) from exc
    return SamplingParams(
        max_tokens=max_completion_tokens if max_tokens is None else max_tokens,
        top_k=body.integer("top_k"),
        seed=body.integer("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        repetition_penalty=body.number("repetition_penalty"),
        n=body.integer("n"),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        response_format=response_format,
        **floats,
    )


def _load(line: str | bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(line, Mapping):
        return line
    try:
        loaded = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise RequestError(ErrorCode.MALFORMED, f"not a JSON batch line: {exc}") from exc
    if not isinstance(loaded, dict):
        raise RequestError(ErrorCode.MALFORMED, "a batch line must be a JSON object")
    return loaded


def parse_line(line: str | bytes | Mapping[str, Any]) -> InferenceRequest:
    """The validated request of one batch input line; :class:`RequestError` otherwise.

    4001 for a line that is not a JSON object, lacks ``custom_id``, has a field of the
    wrong type or text that UTF-8 cannot encode (a lone surrogate such as ``"\\ud800"``);
    4002 for an unsupported ``method``/``url`` or a value out of range. The error carries
    ``custom_id`` whenever the line has one, escaped if UTF-8 cannot encode it, and the
    line's ``batch_id`` and ``batch_total`` where they are readable.
    """
    obj = _load(line)
    try:
        return _request_of(obj)
    except RequestError as exc:
        raise exc.in_batch(*_batch_of(obj)) from exc


def _batch_of(obj: Mapping[str, Any]) -> tuple[str, int]:
    """``(batch_id, batch_total)`` of a line as far as they are readable, else ``("", 0)``."""
    batch_id, total = obj.get("batch_id"), obj.get("batch_total")
    return (
        escaped(batch_id) if isinstance(batch_id, str) else "",
        total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else 0,
    )


def _request_of(obj: Mapping[str, Any]) -> InferenceRequest:
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestError(ErrorCode.MALFORMED, "custom_id must be a non-empty string")
    check_custom_id(custom_id)
    top = Fields(obj, "", custom_id)
    top.unknown(LINE_KEYS, "not a batch line key")
    method, url = top.get("method", str, "a string"), top.get("url", str, "a string")
    raw_body = top.get("body", dict, "an object")
    if method is None or url is None or raw_body is None:
        raise top.error(ErrorCode.MALFORMED, "a batch line needs method, url and body")
    if method != "POST":
        raise top.error(ErrorCode.INVALID_PARAMETER, f"method must be POST, got {method!r}")
    body = Fields(raw_body, "body.", custom_id)
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    token_ids: tuple[int, ...] = ()
    endpoint = URLS.get(url)
    if endpoint is None:
        raise top.error(ErrorCode.INVALID_PARAMETER, f"url must be one of {', '.join(URLS)}", "url")
    _check_body(body, endpoint, url)
    if endpoint == "embeddings":
        embeddings = _embeddings_request(custom_id, top, body)
        validate_request(embeddings)
        return embeddings
    if endpoint == "responses":
        return _responses_request(custom_id, top, body)
    if endpoint == "chat":
        messages = _messages(body)
    else:
        prompt, token_ids = _prompt(body)
    thinking = body.get("enable_thinking", bool, "a boolean")
    template_kwargs = body.get("chat_template_kwargs", dict, "an object")
    if template_kwargs is not None:
        kwargs = Fields(template_kwargs, "body.chat_template_kwargs.", custom_id)
        kwargs.unknown(frozenset({"enable_thinking"}), "only enable_thinking is taken")
        if thinking is None:
            thinking = kwargs.get("enable_thinking", bool, "a boolean")
    req = InferenceRequest(
        **_envelope(custom_id, top, body),
        messages=messages,
        prompt=prompt,
        prompt_token_ids=token_ids,
        sampling=_sampling(body, endpoint),
        enable_thinking=thinking,
        metadata=MappingProxyType({**body.string_map("metadata"), **top.string_map("metadata")}),
    )
    validate_request(req)
    return req


def request_to_line(req: InferenceRequest) -> dict[str, Any]:
    """The batch input line of ``req``: ``parse_line(request_to_line(req)) == req``."""
    body: dict[str, Any] = {"model": req.model}
    if req.responses:
        return _line(req, RESPONSES_URL, responses_body(req))
    if req.embedding_inputs:
        url = EMBEDDINGS_URL
        body["input"] = list(req.embedding_inputs)
        body["encoding_format"] = req.encoding_format
        if req.dimensions is not None:
            body["dimensions"] = req.dimensions
    elif req.prompt is not None or req.prompt_token_ids:
        url = COMPLETIONS_URL
        body["prompt"] = req.prompt if req.prompt is not None else list(req.prompt_token_ids)
    else:
        url = CHAT_URL
        body["messages"] = [{"role": m.role, "content": m.content} for m in req.messages]
    s = req.sampling
    for name in ("max_tokens", *_OPTIONAL_FLOATS, "top_k", "seed", "repetition_penalty", "n"):
        if getattr(s, name) is not None:
            body[name] = getattr(s, name)
    if s.stop:
        body["stop"] = list(s.stop)
    if url == CHAT_URL:
        body.update(
            (name, getattr(s, name))
            for name in ("logprobs", "top_logprobs")
            if getattr(s, name) is not None
        )
        if s.response_format.type != "text":
            body["response_format"] = format_to_json(s.response_format)
    elif s.logprobs:
        body["logprobs"] = s.top_logprobs or 0
    if req.enable_thinking is not None:
        body["enable_thinking"] = req.enable_thinking
    return _line(req, url, body)


def _line(req: InferenceRequest, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The batch line of ``req`` around its ``body``, with batchpipe's extensions."""
    line: dict[str, Any] = {"custom_id": req.custom_id, "method": "POST", "url": url, "body": body}
    extensions = {
        "metadata": dict(req.metadata) or None,
        "batch_id": req.batch_id or None,
        "batch_total": req.batch_total or None,
        "priority": req.priority or None,
        "deadline": req.deadline,
        "submitted_at": req.submitted_at,
    }
    line.update((key, value) for key, value in extensions.items() if value is not None)
    return line
