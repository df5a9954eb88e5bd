"""The output format of a request <-> :class:`~worker.wire.messages.ResponseFormat`.

Chat completions name it ``response_format``; ``/v1/responses`` names it ``text.format``
and flattens the schema into it. Accepted shapes, as the two APIs define them::

    response_format: {"type": "text"} | {"type": "json_object"}
                   | {"type": "json_schema", "json_schema": {"name": "...", "schema": {...},
                                                             "strict": true, "description": "..."}}
    text:            {"format": {"type": "text"} | {"type": "json_object"}
                              | {"type": "json_schema", "name": "...", "schema": {...},
                                 "strict": true, "description": "..."}}

``description`` is informational (it guides a model through its prompt at OpenAI; here
it changes nothing). A wrong type is 4001, anything else unsupported 4002, both naming
the field (``response_format`` or ``text``). Whether the schema compiles is the engine's
question, asked at admission.
"""

from __future__ import annotations

import json
from typing import Any

from worker.errors import ErrorCode, RequestError
from worker.wire.messages import ResponseFormat

PARAM = "response_format"
TEXT_PARAM = "text"
_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})
_KINDS = ("text", "json_object", "json_schema")


def _error(code: ErrorCode, message: str, param: str = PARAM) -> RequestError:
    return RequestError(code, f"{param}: {message}", param=param)


def _json_schema(spec: Any, where: str, param: str) -> ResponseFormat:
    """``spec``: the name, schema, strict flag and description of a json_schema format."""
    if not isinstance(spec, dict):
        raise _error(ErrorCode.MALFORMED, f"{where} must be an object", param)
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    if unknown:
        raise _error(ErrorCode.INVALID_PARAMETER, f"unknown field {where}.{unknown[0]}", param)
    name, schema, strict = spec.get("name"), spec.get("schema"), spec.get("strict")
    if not isinstance(name, str) or not name:
        raise _error(ErrorCode.MALFORMED, f"{where}.name must be a non-empty string", param)
    if schema is None:
        schema = {}  # OpenAI: no schema means any JSON object
    if not isinstance(schema, dict):
        raise _error(ErrorCode.MALFORMED, f"{where}.schema must be a JSON Schema object", param)
    if strict is not None and not isinstance(strict, bool):
        raise _error(ErrorCode.MALFORMED, f"{where}.strict must be a boolean", param)
    return ResponseFormat("json_schema", json.dumps(schema, ensure_ascii=False), name, strict)


def _typed(value: Any, param: str, where: str, flat: bool) -> ResponseFormat:
    """One format object: ``{"type": ...}`` and, for json_schema, its spec — nested under
    ``json_schema`` (chat) or beside ``type`` (``flat``, /v1/responses)."""
    if not isinstance(value, dict):
        raise _error(ErrorCode.MALFORMED, f"{where}must be an object with a type", param)
    kind = value.get("type")
    if kind not in _KINDS:
        raise _error(
            ErrorCode.INVALID_PARAMETER,
            f"{where}type must be text, json_object or json_schema, got {kind!r}",
            param,
        )
    schema_keys = _SCHEMA_KEYS if flat else {"json_schema"}
    extra = sorted(set(value) - {"type"} - (schema_keys if kind == "json_schema" else set()))
    if extra:
        raise _error(
            ErrorCode.INVALID_PARAMETER, f"unknown field {where}{extra[0]} for type {kind}", param
        )
    if kind != "json_schema":
        return ResponseFormat(kind)
    if flat:
        spec = {key: item for key, item in value.items() if key != "type"}
        return _json_schema(spec, where.rstrip("."), param)
    return _json_schema(value.get("json_schema"), "json_schema", param)


def format_from_json(value: Any) -> ResponseFormat:
    """The request's ``response_format`` (None or absent: free text)."""
    return ResponseFormat() if value is None else _typed(value, PARAM, "", flat=False)


def text_format_from_json(value: Any) -> ResponseFormat:
    """The format of a /v1/responses ``text`` option (None, absent or no format: free
    text). ``verbosity`` asks the model for shorter or longer text, which nothing here
    can honour: 4002 unless null."""
    if value is None:
        return ResponseFormat()
    if not isinstance(value, dict):
        raise _error(ErrorCode.MALFORMED, "must be an object", TEXT_PARAM)
    for key, item in value.items():
        if key not in ("format", "verbosity"):
            raise _error(ErrorCode.INVALID_PARAMETER, f"unknown field text.{key}", TEXT_PARAM)
        if key == "verbosity" and item is not None:
            raise _error(ErrorCode.INVALID_PARAMETER, "verbosity is not supported", TEXT_PARAM)
    fmt = value.get("format")
    return ResponseFormat() if fmt is None else _typed(fmt, TEXT_PARAM, "format.", flat=True)


def format_to_json(fmt: ResponseFormat) -> dict[str, Any]:
    """The ``response_format`` object of ``fmt``: ``format_from_json`` inverts it."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    return {"type": "json_schema", "json_schema": _spec(fmt)}


def text_format_to_json(fmt: ResponseFormat) -> dict[str, Any]:
    """The ``text`` option of ``fmt``: ``text_format_from_json`` inverts it."""
    if fmt.type != "json_schema":
        return {"format": {"type": fmt.type}}
    return {"format": {"type": "json_schema", **_spec(fmt)}}


def _spec(fmt: ResponseFormat) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": fmt.name, "schema": json.loads(fmt.schema or "{}")}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return spec
