"""A remote engine's "token ids": the request's input, packed losslessly 4 bytes an id.

The worker counts, deduplicates and groups requests by their token ids (admission's
``max_batch_tokens`` check, dedup keys, shared-prefix keys), but the remote engine has no
tokenizer: the server tokenizes. So its ids are the UTF-8 bytes of the input in a compact
JSON form, read as little-endian 32-bit words, with the byte length last:

* identical input ⇔ identical ids, so dedup stays exact (no digest that could collide);
* inputs sharing a system message share a prefix of ids, so shared-prefix formation
  groups them as it would with real tokens (and the server's prefix cache gains);
* about one id per 4 bytes, which for English text is close to one per token: the
  admission limits hold as an estimate. Usage comes from the server's answer.
* :func:`unpack` gives the input back in ``submit``, so nothing beside the ids has to
  reach the engine.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from worker.wire.messages import InferenceRequest


def pack(value: Any) -> tuple[int, ...]:
    """``value`` (JSON-able) as ids: its compact JSON's UTF-8 words, then its byte length."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    words = -(-len(data) // 4)
    return (*struct.unpack(f"<{words}I", data.ljust(words * 4, b"\0")), len(data))


def unpack(ids: tuple[int, ...]) -> Any:
    """The value :func:`pack` packed into ``ids``."""
    *words, length = ids
    return json.loads(struct.pack(f"<{len(words)}I", *words)[:length])


def request_input(request: InferenceRequest) -> list[Any]:
    """The part of a generation request that the sampling settings do not hold:
    ``[endpoint, value]``, the value ``[[role, content], …]`` for messages (chat and
    responses), the prompt's text, or its list of token ids (completions). A chat request
    whose ``enable_thinking`` is set (by the request, or a configured true: intake leaves
    it unset only when neither asks) adds it third, as a local engine's chat template
    renders it into the tokens; unset, the server's own template default applies."""
    if request.messages:
        value: Any = [[m.role, m.content] for m in request.messages]
    else:
        value = request.prompt if request.prompt is not None else list(request.prompt_token_ids)
    if request.endpoint == "chat" and request.enable_thinking is not None:
        return [request.endpoint, value, request.enable_thinking]
    return [request.endpoint, value]


def embedding_input(text: str, dimensions: int | None) -> list[Any]:
    """One embeddings input, with the request's ``dimensions`` (None: the model's own)."""
    return [dimensions, text]
