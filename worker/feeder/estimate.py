"""A request's estimated tokens: what fair share charges and the token limit counts.

Cheap and without a tokenizer: its prompt (``prompt_token_ids`` when given, else its
text — messages, prompt or embedding inputs — at :data:`CHARS_PER_TOKEN` characters a
token, rounded up) plus its ``max_tokens`` (or the configured ``generation.max_tokens``
when the line gives none; 0 for embeddings). Publishers write it on each pending record
(the ``tokens`` header, docs/architecture.md §10); ``serve`` sums it per batch for
``api.max_enqueued_tokens`` (:mod:`batchpipe.api.quota`).
"""

from __future__ import annotations

import math

from worker.wire.messages import InferenceRequest

CHARS_PER_TOKEN = 4


def request_tokens(req: InferenceRequest, default_max_tokens: int) -> int:
    text = sum(len(m.content) for m in req.messages) + len(req.prompt or "")
    text += sum(len(t) for t in req.embedding_inputs)
    prompt = len(req.prompt_token_ids) or math.ceil(text / CHARS_PER_TOKEN)
    if req.endpoint == "embeddings":
        return prompt
    max_tokens = req.sampling.max_tokens
    return prompt + (default_max_tokens if max_tokens is None else max_tokens)
