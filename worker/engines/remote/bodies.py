"""What a remote engine sends an OpenAI-compatible server, and what it reads back.

One request in, one HTTP call out, to the endpoint the request addressed: chat to
``/chat/completions``, completions to ``/completions``, responses to ``/responses`` and
embeddings to ``/embeddings``. Every resolved setting goes into the body under its OpenAI
name, and only when it is not its off value: a request that sets nothing beyond OpenAI's
fields is a body of OpenAI's fields only, which any OpenAI-compatible server (OpenAI's
own, which answers 400 to a field it does not know) takes. The extensions vLLM and SGLang
accept are sent only when asked for: ``top_k`` when above 0, ``repetition_penalty`` when
not 1.0, and ``chat_template_kwargs.enable_thinking`` on a chat request whose
``enable_thinking`` is set (by the request, or ``generation.enable_thinking: true``);
unset, the server's chat template decides (Qwen3's thinks; vLLM's
``--default-chat-template-kwargs`` sets it server-wide). A server that refuses a field
answers 400, which the worker passes on as 4002 with the server's own message, never
dropping the field quietly.

The answer is read strictly: a body that is not the endpoint's object, or not what was
asked (other than ``n`` choices, other than one vector per input or of ``dimensions``
numbers, a usage that is not a count), raises :class:`AnswerError` (the request then
fails with 5000 naming what was wrong). Usage is the server's own count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.remote.packing import unpack
from worker.errors import BatchpipeError
from worker.wire.messages import Choice, FinishReason, Logprobs, ResponseFormat, TokenLogprob

PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
}


class AnswerError(BatchpipeError, ValueError):
    """The server answered 200 with a body that is not what the endpoint returns."""


@dataclass(frozen=True)
class Call:
    """One HTTP request: the path under ``base_url`` and the JSON body."""

    endpoint: str
    body: Mapping[str, Any]

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]


def request_call(model: str, item: EngineInput) -> Call:
    """The call for a chat, completions or responses ``item`` (its ids packed by
    :func:`worker.engines.remote.packing.request_input`)."""
    endpoint, value, *thinking = unpack(item.prompt_token_ids)
    return generation_call(model, endpoint, value, item.sampling, *thinking)


def generation_call(
    model: str, endpoint: str, value: Any, s: ResolvedSampling, thinking: bool | None = None
) -> Call:
    """The call for a chat, completions or responses request (``value`` and ``thinking``,
    the request's ``enable_thinking`` where set, as packed by
    :func:`worker.engines.remote.packing.request_input`)."""
    if endpoint == "responses":
        body: dict[str, Any] = {
            "model": model,
            "input": [{"role": role, "content": content} for role, content in value],
            "max_output_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if s.response_format.type != "text":
            body["text"] = {"format": _format(s.response_format, nested=False)}
        return Call(endpoint, body)
    body = {"model": model, "max_tokens": s.max_tokens, "temperature": s.temperature}
    if endpoint == "chat":
        body["messages"] = [{"role": role, "content": content} for role, content in value]
        if thinking is not None:  # a vLLM/SGLang extension: sent only when asked for
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
    else:
        body["prompt"] = value
    optional = {  # each sent only when not its off value (top_k, repetition_penalty: extensions)
        "top_p": (s.top_p, 1.0),
        "top_k": (s.top_k, 0),
        "presence_penalty": (s.presence_penalty, 0.0),
        "frequency_penalty": (s.frequency_penalty, 0.0),
        "repetition_penalty": (s.repetition_penalty, 1.0),
        "n": (s.n, 1),
    }
    body.update({name: v for name, (v, off) in optional.items() if v != off})
    if s.seeded:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.logprobs and endpoint == "chat":
        body["logprobs"] = True
        body["top_logprobs"] = s.top_logprobs
    elif s.logprobs:  # completions: the number of likeliest tokens, the chosen one always
        body["logprobs"] = s.top_logprobs
    if s.response_format.type != "text":
        body["response_format"] = _format(s.response_format, nested=True)
    return Call(endpoint, body)


def embeddings_call(model: str, texts: list[str], dimensions: int | None) -> Call:
    body: dict[str, Any] = {"model": model, "input": texts, "encoding_format": "float"}
    if dimensions is not None:
        body["dimensions"] = dimensions
    return Call("embeddings", body)


def _format(fmt: ResponseFormat, *, nested: bool) -> dict[str, Any]:
    """``response_format`` for chat/completions (``nested``: the schema under
    ``json_schema``), or ``text.format`` for responses (flat)."""
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": fmt.name or "output", "schema": json.loads(fmt.schema)}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return (
        {"type": "json_schema", "json_schema": schema}
        if nested
        else {"type": "json_schema", **schema}
    )


def completion_of(key: str, call: Call, answer: Any) -> Completion:
    """The :class:`Completion` of ``answer`` (the parsed JSON body of a 200)."""
    if isinstance(answer, dict) and answer.get("error") and "choices" not in answer:
        error = answer["error"]  # a 200 carrying an error object, as some proxies send
        message = error.get("message") if isinstance(error, dict) else error
        raise AnswerError(f"the server answered 200 with an error: {str(message)[:500]}")
    try:
        if not isinstance(answer, dict):
            raise TypeError(f"a JSON {type(answer).__name__}, not an object")
        if call.endpoint == "embeddings":
            return _embeddings(key, call, answer)
        if call.endpoint == "responses":
            return _response(key, answer)
        return _choices(key, call, answer)
    except AnswerError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise AnswerError(f"the server's {call.path} answer is not readable: {exc!r}") from exc


def _choices(key: str, call: Call, answer: Mapping[str, Any]) -> Completion:
    rows = _in_order(answer["choices"], int(call.body.get("n", 1)), "choices", "n")
    chat = call.endpoint == "chat"
    choices = []
    for row in rows:
        text = _text(row["message"].get("content") if chat else row["text"])
        logprobs = _chat_logprobs(row) if chat else _text_logprobs(row)
        choices.append(Choice(text, _finish(row.get("finish_reason")), logprobs))
    usage = answer.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    first = choices[0]
    return Completion(
        key=key,
        text=first.text,
        finish_reason=first.finish_reason,
        prompt_tokens=_tokens(usage, "prompt_tokens"),
        completion_tokens=_tokens(usage, "completion_tokens"),
        reasoning_tokens=_tokens(details, "reasoning_tokens"),
        logprobs=first.logprobs,
        extra_choices=tuple(choices[1:]),
    )


def _response(key: str, answer: Mapping[str, Any]) -> Completion:
    status = answer.get("status", "completed")
    if status not in ("completed", "incomplete"):  # failed, or a background one unfinished
        error = answer.get("error") or {}
        raise AnswerError(f"the response is {status}: {str(error.get('message', ''))[:500]}")
    texts = [
        part["text"]
        for item in answer["output"]
        if item.get("type") == "message"
        for part in item["content"]
        if part.get("type") == "output_text"
    ]
    incomplete = (answer.get("incomplete_details") or {}).get("reason")
    usage = answer.get("usage") or {}
    details = usage.get("output_tokens_details") or {}
    return Completion(
        key=key,
        text="".join(_text(t) for t in texts),
        finish_reason=_finish("length" if incomplete == "max_output_tokens" else incomplete),
        prompt_tokens=_tokens(usage, "input_tokens"),
        completion_tokens=_tokens(usage, "output_tokens"),
        reasoning_tokens=_tokens(details, "reasoning_tokens"),
    )


def _embeddings(key: str, call: Call, answer: Mapping[str, Any]) -> Completion:
    rows = _in_order(answer["data"], len(call.body["input"]), "data", "inputs")
    vectors = tuple(tuple(float(x) for x in row["embedding"]) for row in rows)
    sizes = {len(v) for v in vectors}
    wanted = call.body.get("dimensions")
    if len(sizes) != 1 or (wanted is not None and sizes != {wanted}) or sizes == {0}:
        raise AnswerError(f"vectors of {sorted(sizes)} numbers, {wanted or 'one size'} wanted")
    if not all(math.isfinite(x) for v in vectors for x in v):
        raise AnswerError("a vector holds a number that is not finite")
    usage = answer.get("usage") or {}
    return Completion(key=key, prompt_tokens=_tokens(usage, "prompt_tokens"), embeddings=vectors)


def _in_order(rows: Any, expected: int, name: str, asked: str) -> list[Any]:
    """``rows`` (choices, embeddings) ordered by ``index``: exactly one for each of the
    ``expected`` the request asked for, never fewer, more or a repeated index."""
    if not isinstance(rows, list):
        raise TypeError(f"{name} is a {type(rows).__name__}, not a list")
    indexes = [row.get("index", i) for i, row in enumerate(rows)]
    if sorted(indexes) != list(range(expected)):
        raise AnswerError(f"{name} indexes {sorted(indexes)[:10]} for {expected} {asked}")
    return [row for _, row in sorted(zip(indexes, rows, strict=True), key=lambda p: p[0])]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"text is a {type(value).__name__}, not a string")
    return value


def _tokens(usage: Mapping[str, Any], name: str) -> int:
    """A count of the server's usage; absent reads as 0, anything but a count is refused."""
    value = usage.get(name) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AnswerError(f"usage {name} is {value!r}, not a count of tokens")
    return value


def _finish(reason: Any) -> FinishReason:
    """The server's ``finish_reason``: length and content_filter are kept; stop, and what
    only tools or an unfinished stream give (no tools are ever sent), read as stop."""
    return reason if reason in ("length", "content_filter") else "stop"


def _chat_logprobs(row: Mapping[str, Any]) -> Logprobs:
    content = (row.get("logprobs") or {}).get("content")
    if content is None:
        return None
    return tuple(
        TokenLogprob(
            str(t["token"]),
            float(t["logprob"]),
            tuple(
                TokenLogprob(str(o["token"]), float(o["logprob"]))
                for o in t.get("top_logprobs") or ()
            ),
        )
        for t in content
    )


def _text_logprobs(row: Mapping[str, Any]) -> Logprobs:
    lp = row.get("logprobs")
    if not lp:
        return None
    tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
    return tuple(
        TokenLogprob(
            str(token),
            float(value),
            tuple(TokenLogprob(str(k), float(v)) for k, v in (top or {}).items()),
        )
        for token, value, top in zip(lp["tokens"], lp["token_logprobs"], tops, strict=True)
    )
