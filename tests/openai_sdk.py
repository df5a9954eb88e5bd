"""Reading answers with the official ``openai`` SDK's own types, as a user's code would.

:func:`sdk_parse` validates strictly (pydantic ``strict=True``: no coercion of a string
to a number or of a float to an integer) and then walks the parsed model: the SDK's
models accept unknown keys into ``model_extra``, so a key the SDK does not know — a
misspelt or invented field — fails here too.

An embeddings body with ``encoding_format: base64`` carries each vector as a base64
string, which the SDK's client decodes (little-endian float32, as
``openai.lib._parsing._embeddings`` does) before its ``CreateEmbeddingResponse`` holds it;
:func:`sdk_line` decodes it the same way and then validates strictly.
"""

from __future__ import annotations

import array
import base64
import sys
from typing import Any, TypeVar

from openai import BaseModel as SDKModel
from openai.types import BatchError, Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.shared import ErrorObject

__all__ = [
    "BatchError",
    "ChatCompletion",
    "Completion",
    "CreateEmbeddingResponse",
    "ErrorObject",
    "Response",
    "decoded_vector",
    "sdk_line",
    "sdk_parse",
]

M = TypeVar("M", bound=SDKModel)


def _unknown_keys(value: Any, where: str) -> list[str]:
    if isinstance(value, SDKModel):
        found = [f"{where}.{key}" for key in value.model_extra or {}]
        for name in type(value).model_fields:
            found += _unknown_keys(getattr(value, name), f"{where}.{name}")
        return found
    if isinstance(value, list):
        return [key for i, item in enumerate(value) for key in _unknown_keys(item, f"{where}[{i}]")]
    return []


def sdk_parse(model: type[M], data: Any) -> M:
    """``data`` as the SDK type ``model``; AssertionError for a key the SDK does not know."""
    parsed = model.model_validate(data, strict=True)
    unknown = _unknown_keys(parsed, model.__name__)
    assert not unknown, f"keys the openai SDK does not know: {unknown}"
    return parsed


def decoded_vector(encoded: str) -> list[float]:
    """A base64 embedding as the SDK's client decodes it: little-endian float32 values."""
    values = array.array("f", base64.b64decode(encoded, validate=True))
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def _embeddings(body: dict[str, Any]) -> CreateEmbeddingResponse:
    data = [
        {**item, "embedding": decoded_vector(item["embedding"])}
        if isinstance(item.get("embedding"), str)
        else item
        for item in body.get("data", [])
    ]
    return sdk_parse(CreateEmbeddingResponse, {**body, "data": data})


def sdk_line(
    line: dict[str, Any],
) -> ChatCompletion | Completion | CreateEmbeddingResponse | Response | ErrorObject:
    """One batch output or error line read with the SDK: its body's type, checked."""
    response = line["response"]
    if line["error"] is not None:
        sdk_parse(BatchError, line["error"])
        return sdk_parse(ErrorObject, response["body"]["error"])
    body = response["body"]
    if body["object"] == "list":
        return _embeddings(body)
    if body["object"] == "response":
        return sdk_parse(Response, body)
    kind: type[ChatCompletion] | type[Completion] = (
        ChatCompletion if body["object"] == "chat.completion" else Completion
    )
    return sdk_parse(kind, body)
