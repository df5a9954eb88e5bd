"""The body of a ``/v1/responses`` batch line <-> chat messages and sampling settings.

A Responses API request is run as the chat request it amounts to, so no engine needs to
know the endpoint; only the answer differs (a ``response`` object, :mod:`worker.wire.answers`):

* ``instructions`` — a system message placed before the input, as OpenAI describes it;
* ``input`` — a string (one user message) or a list of message items
  ``{"type": "message", "role", "content"}`` (``type`` may be left out), with roles
  ``user``, ``system``, ``developer`` and ``assistant``; ``content`` is a string or a list
  of ``input_text`` parts (``output_text`` parts in an assistant message, as a previous
  response's output item has them, with no annotations). Other items (tool calls and
  their outputs, references, reasoning) and other parts (images, files, audio) are 4002
  naming ``input``;
* ``max_output_tokens``, ``temperature``, ``top_p`` — the sampling settings of the same
  meaning; ``text.format`` — the structured-output format of chat's ``response_format``.

Every other body field is in :mod:`worker.wire.fields` (``metadata``, ``user``,
``store: false`` and the like) or refused by name. The Responses API has no ``stop``,
``n``, ``seed`` or penalties (the SDK's ``ResponseCreateParams``): they are unknown fields.
"""

from __future__ import annotations

from typing import Any

from worker.errors import ErrorCode, RequestError
from worker.wire.jsonfields import Fields
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams
from worker.wire.response_format import (
    TEXT_PARAM,
    text_format_from_json,
    text_format_to_json,
)
from worker.wire.validation import RESPONSES_ROLES as ROLES

RESPONSES_URL = "/v1/responses"
ITEM_KEYS = frozenset({"type", "role", "content"})
_TEXT_PART_KEYS = frozenset({"type", "text"})
#: internal setting names -> the /v1/responses field that sets them, for error params
RESPONSES_NAMES = {"max_tokens": "max_output_tokens", "response_format": TEXT_PARAM}
PARAM = "input"


def _part(part: Any, role: str, body: Fields, where: str) -> str:
    """One content part's text: ``input_text``, or ``output_text`` in an assistant message."""
    if not isinstance(part, dict):
        raise body.error(ErrorCode.MALFORMED, f"{where} must be an object")
    kind = part.get("type")
    allowed = ("input_text", "output_text") if role == "assistant" else ("input_text",)
    if kind not in allowed:
        raise body.error(
            ErrorCode.INVALID_PARAMETER,
            f"{where}: {kind!r} parts are not supported in a {role} message; "
            f"only {' and '.join(allowed)} (text)",
            PARAM,
        )
    fields = Fields(part, f"{where}.", body.custom_id)
    if kind == "output_text":
        annotations = fields.get("annotations", list, "a list")
        if annotations:
            raise body.error(
                ErrorCode.INVALID_PARAMETER, f"{where}.annotations are not supported", PARAM
            )
        fields.unknown(_TEXT_PART_KEYS | {"annotations"}, "an output_text part is its text")
    else:
        fields.unknown(_TEXT_PART_KEYS, "an input_text part is its text")
    text = fields.get("text", str, "a string")
    if text is None:
        raise body.error(ErrorCode.MALFORMED, f"{where}.text is required")
    return str(text)


def _item(item: Any, body: Fields, where: str) -> ChatMessage:
    """One input item: a message with a role and text content."""
    if not isinstance(item, dict):
        raise body.error(ErrorCode.MALFORMED, f"{where} must be an object")
    kind = item.get("type", "message")
    if kind != "message":
        raise body.error(
            ErrorCode.INVALID_PARAMETER,
            f"{where}: {kind!r} items are not supported; only messages",
            PARAM,
        )
    fields = Fields(item, f"{where}.", body.custom_id)
    fields.unknown(ITEM_KEYS, "an input message is a type, a role and its text content")
    role = fields.get("role", str, "a string")
    if role not in ROLES:
        raise body.error(
            ErrorCode.INVALID_PARAMETER,
            f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}",
            PARAM,
        )
    content = item.get("content")
    if isinstance(content, str):
        return ChatMessage(role, content)
    if not isinstance(content, list):
        raise body.error(
            ErrorCode.MALFORMED, f"{where}.content must be a string or a list of parts"
        )
    texts = [_part(part, role, body, f"{where}.content[{i}]") for i, part in enumerate(content)]
    return ChatMessage(role, "\n".join(texts))


def responses_messages(body: Fields) -> tuple[ChatMessage, ...]:
    """``instructions`` (a leading system message) and ``input`` as chat messages."""
    instructions = body.get("instructions", str, "a string")
    raw = body.obj.get("input")
    items: tuple[ChatMessage, ...]
    if isinstance(raw, str):
        items = (ChatMessage("user", raw),)
    elif isinstance(raw, list) and raw:
        items = tuple(_item(item, body, f"body.input[{i}]") for i, item in enumerate(raw))
    else:
        raise body.error(
            ErrorCode.MALFORMED,
            f"body.input is required for {RESPONSES_URL}: a string or a list of messages",
        )
    return ((ChatMessage("system", instructions),) if instructions else ()) + items


def responses_sampling(body: Fields) -> SamplingParams:
    """The sampling settings a /v1/responses body sets."""
    try:
        response_format = text_format_from_json(body.obj.get(TEXT_PARAM))
    except RequestError as exc:
        raise body.error(exc.code, exc.message, exc.param) from exc
    return SamplingParams(
        max_tokens=body.integer("max_output_tokens"),
        temperature=body.number("temperature"),
        top_p=body.number("top_p"),
        response_format=response_format,
    )


def named_for_responses(exc: RequestError) -> RequestError:
    """``exc`` with its param named as the /v1/responses body names it."""
    internal = exc.param or ""
    param = RESPONSES_NAMES.get(internal)
    if param is None:
        return exc
    message = exc.message.replace(internal, param, 1)
    return RequestError(exc.code, message, exc.custom_id, param=param)


def responses_body(req: InferenceRequest) -> dict[str, Any]:
    """The /v1/responses body of ``req`` (its messages all in ``input``)."""
    body: dict[str, Any] = {
        "model": req.model,
        "input": [{"role": m.role, "content": m.content} for m in req.messages],
    }
    s = req.sampling
    settings = {"max_output_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p}
    body.update((name, value) for name, value in settings.items() if value is not None)
    if s.response_format.type != "text":
        body[TEXT_PARAM] = text_format_to_json(s.response_format)
    return body
