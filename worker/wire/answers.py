"""Results as OpenAI batch output and error lines, in the exact shapes of the OpenAI API.

A completed result becomes an output line whose ``response.body`` is what the endpoint
the request addressed returns: a ``chat.completion`` (``ChatCompletion`` in the official
``openai`` SDK) for ``/v1/chat/completions``, a ``text_completion`` (``Completion``) for
``/v1/completions`` — one choice per ``n``, each with its ``logprobs`` in that endpoint's
form when the request asked for them — and a ``list`` of ``embedding`` objects
(``CreateEmbeddingResponse``) for ``/v1/embeddings``, each vector a list of numbers or,
with ``encoding_format: base64``, the base64 of its little-endian float32 bytes, and a
``response`` (``openai.types.responses.Response``) for ``/v1/responses``: one assistant
``message`` output item with one ``output_text`` part, ``status`` ``completed``, or
``incomplete`` with ``incomplete_details.reason: max_output_tokens`` when the text was
cut by length. A failed result becomes an error line:
``response.body.error`` is an OpenAI error object (``message``, ``type``, ``param``,
``code``) and the top-level ``error`` the batch line's own (``code``, ``message``,
``param``), as the SDK's ``ErrorObject`` and ``BatchError`` read them. ``code`` is
batchpipe's wire code as a string (docs/architecture.md §5); ``param`` names the request
field at fault, else null.

``tests/unit/worker/wire/test_answers.py`` validates every shape with the SDK types.
Schemas: ``schemas/batch-output-line.schema.json``, ``schemas/batch-error-line.schema.json``.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from worker.wire.messages import (
    Choice,
    EncodingFormat,
    Endpoint,
    InferenceResult,
    Logprobs,
    TokenLogprob,
)


def _ids(result: InferenceResult) -> tuple[str, str]:
    """``(request_id, response body id)``, derived from the stable result id."""
    digest = result.result_id.removeprefix("batch_req_")
    if result.endpoint == "responses":
        return f"req_{digest}", f"resp_{digest}"
    prefix = "chatcmpl" if result.endpoint == "chat" else "cmpl"
    return f"req_{digest}", f"{prefix}-{digest}"


def _token(token: TokenLogprob) -> dict[str, Any]:
    return {"token": token.token, "logprob": token.logprob, "bytes": list(token.token.encode())}


def _chat_logprobs(logprobs: Logprobs) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = [{**_token(t), "top_logprobs": [_token(top) for top in t.top]} for t in logprobs]
    return {"content": content, "refusal": None}


def _text_logprobs(logprobs: Logprobs) -> dict[str, Any] | None:
    """The completions endpoint's form: parallel lists, top alternatives as maps."""
    if logprobs is None:
        return None
    offsets, at = [], 0
    for t in logprobs:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in logprobs],
        "token_logprobs": [t.logprob for t in logprobs],
        "top_logprobs": [{top.token: top.logprob for top in t.top} for t in logprobs],
        "text_offset": offsets,
    }


def _choice(endpoint: Endpoint, index: int, choice: Choice) -> dict[str, Any]:
    if endpoint == "chat":
        return {
            "index": index,
            "message": {"role": "assistant", "content": choice.text, "refusal": None},
            "logprobs": _chat_logprobs(choice.logprobs),
            "finish_reason": choice.finish_reason,
        }
    return {
        "index": index,
        "text": choice.text,
        "logprobs": _text_logprobs(choice.logprobs),
        "finish_reason": choice.finish_reason,
    }


def encode_vector(vector: tuple[float, ...], encoding: EncodingFormat) -> list[float] | str:
    """One embedding as the answer writes it: numbers, or base64 of little-endian float32."""
    if encoding == "float":
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _embeddings_body(result: InferenceResult) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode_vector(vector, result.encoding_format),
            }
            for i, vector in enumerate(result.embeddings)
        ],
        "model": result.model,
        "usage": {
            "prompt_tokens": result.usage.prompt_tokens,
            "total_tokens": result.usage.total_tokens,
        },
    }


def _responses_body(result: InferenceResult) -> dict[str, Any]:
    """A Responses API ``response``. The request's own settings (instructions,
    temperature, ...) are not carried by the result: they read as null, as the API allows."""
    _, body_id = _ids(result)
    reason = {"length": "max_output_tokens", "content_filter": "content_filter"}
    cut = reason.get(result.finish_reason)
    status = "incomplete" if cut else "completed"
    usage = result.usage
    message = {
        "type": "message",
        "id": f"msg_{body_id.removeprefix('resp_')}",
        "status": status,
        "role": "assistant",
        "content": [
            {"type": "output_text", "text": result.text, "annotations": [], "logprobs": []}
        ],
    }
    return {
        "id": body_id,
        "object": "response",
        "created_at": int(result.created_at),
        "status": status,
        "completed_at": None if cut else int(result.created_at),
        "error": None,
        "incomplete_details": {"reason": cut} if cut else None,
        "instructions": None,
        "max_output_tokens": None,
        "model": result.model,
        "output": [message],
        "parallel_tool_calls": False,  # no tools are ever called
        "temperature": None,
        "tool_choice": "none",
        "tools": [],
        "top_p": None,
        "metadata": dict(result.metadata),
        "usage": {
            "input_tokens": usage.prompt_tokens,
            # no prompt cache is billed or written here
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens,
        },
    }


def response_body(result: InferenceResult) -> dict[str, Any]:
    """The body the OpenAI endpoint answers for a completed result."""
    if result.endpoint == "embeddings":
        return _embeddings_body(result)
    if result.endpoint == "responses":
        return _responses_body(result)
    _, body_id = _ids(result)
    usage = result.usage
    return {
        "id": body_id,
        "object": "chat.completion" if result.endpoint == "chat" else "text_completion",
        "created": int(result.created_at),
        "model": result.model,
        "choices": [_choice(result.endpoint, i, c) for i, c in enumerate(result.choices)],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        },
    }


def format_output_line(result: InferenceResult) -> dict[str, Any]:
    """The OpenAI batch output line of a completed result."""
    request_id, _ = _ids(result)
    return {
        "id": result.result_id,
        "custom_id": result.custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": response_body(result)},
        "error": None,
        "metadata": dict(result.metadata),
    }


def format_error_line(result: InferenceResult) -> dict[str, Any]:
    """The OpenAI batch error line of a failed result (which always carries an error)."""
    if result.error is None:
        raise ValueError(f"result {result.custom_id!r} has no error to format")
    request_id, _ = _ids(result)
    code, message = str(result.error.code), result.error.message
    param = result.error.param or None
    client_error = 4000 <= result.error.code < 5000
    return {
        "id": result.result_id,
        "custom_id": result.custom_id,
        "response": {
            "status_code": 400 if client_error else 500,
            "request_id": request_id,
            "body": {
                "error": {
                    "message": message,
                    "type": "invalid_request_error" if client_error else "server_error",
                    "param": param,
                    "code": code,
                }
            },
        },
        "error": {"code": code, "message": message, "param": param},
        "metadata": dict(result.metadata),
    }


def format_result_line(result: InferenceResult) -> dict[str, Any]:
    """The output line of a completed result, the error line of a failed one."""
    return format_output_line(result) if result.status == "completed" else format_error_line(result)
