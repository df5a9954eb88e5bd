"""OpenAI's ``response_format`` <-> :class:`~worker.wire.messages.ResponseFormat`.

Accepted shapes, as the chat completions API defines them::

    {"type": "text"}
    {"type": "json_object"}
    {"type": "json_schema", "json_schema": {"name": "...", "schema": {...},
                                            "strict": true, "description": "..."}}

``description`` is informational (it guides a model through its prompt at OpenAI; here
it changes nothing). A wrong type is 4001, anything else unsupported 4002, both naming
``response_format``. Whether the schema compiles is the engine's question, asked at
admission.
"""

from __future__ import annotations

import json
from typing import Any

from worker.errors import ErrorCode, RequestError
from worker.wire.messages import ResponseFormat

PARAM = "response_format"
_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})


def _error(code: ErrorCode, message: str) -> RequestError:
    return RequestError(code, f"{PARAM}: {message}", param=PARAM)


def _json_schema(spec: Any) -> ResponseFormat:
    if not isinstance(spec, dict):
        raise _error(ErrorCode.MALFORMED, "json_schema must be an object")
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    if unknown:
        raise _error(ErrorCode.INVALID_PARAMETER, f"unknown field json_schema.{unknown[0]}")
    name, schema, strict = spec.get("name"), spec.get("schema"), spec.get("strict")
    if not isinstance(name, str) or not name:
        raise _error(ErrorCode.MALFORMED, "json_schema.name must be a non-empty string")
    if schema is None:
        schema = {}  # OpenAI: no schema means any JSON object
    if not isinstance(schema, dict):
        raise _error(ErrorCode.MALFORMED, "json_schema.schema must be a JSON Schema object")
    if strict is not None and not isinstance(strict, bool):
        raise _error(ErrorCode.MALFORMED, "json_schema.strict must be a boolean")
    return ResponseFormat("json_schema", json.dumps(schema, ensure_ascii=False), name, strict)


def format_from_json(value: Any) -> ResponseFormat:
    """The request's ``response_format`` (None or absent: free text)."""
    if value is None:
        return ResponseFormat()
    if not isinstance(value, dict):
        raise _error(ErrorCode.MALFORMED, "must be an object with a type")
    kind = value.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise _error(
            ErrorCode.INVALID_PARAMETER,
            f"type must be text, json_object or json_schema, got {kind!r}",
        )
    extra = sorted(set(value) - allowed[kind])
    if extra:
        raise _error(ErrorCode.INVALID_PARAMETER, f"unknown field {extra[0]} for type {kind}")
    if kind == "json_schema":
        return _json_schema(value.get("json_schema"))
    return ResponseFormat(kind)


def format_to_json(fmt: ResponseFormat) -> dict[str, Any]:
    """The ``response_format`` object of ``fmt``: ``format_from_json`` inverts it."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    spec: dict[str, Any] = {"name": fmt.name, "schema": json.loads(fmt.schema or "{}")}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}
