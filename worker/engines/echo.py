"""The model-free echo engine: a deterministic transform of the prompt, honest token counts.

Its "tokenizer" is UTF-8: one token per byte, so counts are exact and reversible. A chat
renders as ``"role: content\\n"`` lines; the reply is the last user message's content
(a plain prompt is echoed whole). It never imports torch, so it measures the pipeline's
own overhead. Sampling settings cannot change its one answer (``EchoEngine.inert``);
``stop``, ``n`` and ``logprobs`` it honours, and a ``response_format`` it answers with the
schema's minimal valid instance (:mod:`worker.engines.minimal_json`).

It can pace itself like a model on an accelerator, one decoding step per generated token,
each step costing ``delay_per_token_s + delay_per_seq_token_s × rows`` (a fixed cost and
one per sequence in the step). A static batch keeps every row in every step until its
longest row ends, as padded batched generation does; the in-flight echo engine
(:mod:`worker.engines.echo_inflight`) steps only the sequences still running.
``delay_per_batch_s`` adds a fixed cost per batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from worker.engines.base import Completion, EngineInput, OnComplete, StaticEngine
from worker.engines.minimal_json import NoInstance, minimal_instance
from worker.engines.utilization import BusyMeter
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import (
    Choice,
    FinishReason,
    InferenceRequest,
    ResponseFormat,
    TokenLogprob,
)

_ROLES = ("system", "user", "assistant", "tool", "developer")


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The echo engine's chat template: one ``role: content`` line per message."""
    return "".join(f"{role}: {content}\n" for role, content in messages)


def reply_text(prompt: str) -> str:
    """The last user message's content of a rendered chat, else the whole prompt."""
    marker = "user: "
    at = prompt.rfind("\n" + marker)
    if at >= 0:
        start = at + 1
    elif prompt.startswith(marker):
        start = 0
    else:
        return prompt
    body = prompt[start + len(marker) :]
    # the message ends where the next rendered message begins, or at its final newline
    ends = [body.find(f"\n{role}: ") for role in _ROLES]
    last = len(body) - 1 if body.endswith("\n") else len(body)
    end = min((e for e in ends if e >= 0), default=last)
    return body[:end]


#: the log probability echo gives the alternatives it never picks (OpenAI's floor value)
UNLIKELY = -9999.0


def echo_logprobs(data: bytes, top: int) -> tuple[TokenLogprob, ...]:
    """One entry per byte-token: certain (0.0), with ``top`` alternatives — the token itself,
    then the following byte values at :data:`UNLIKELY`. Deterministic, like the reply."""

    def token(byte: int) -> str:
        return bytes([byte]).decode("utf-8", "replace")

    return tuple(
        TokenLogprob(
            token(b),
            0.0,
            tuple(
                TokenLogprob(token((b + k) % 256), 0.0 if k == 0 else UNLIKELY) for k in range(top)
            ),
        )
        for b in data
    )


def echo_completion(item: EngineInput) -> Completion:
    """The echo engine's answer to one input; stop strings and max_tokens as a model would.

    ``n`` choices are ``n`` copies (echo has one possible answer); ``logprobs`` are those
    of :func:`echo_logprobs` for the bytes of the text.
    """
    text, finish, tokens = _reply(item)
    s = item.sampling
    logprobs = echo_logprobs(text.encode(), s.top_logprobs) if s.logprobs else None
    return Completion(
        key=item.key,
        text=text,
        finish_reason=finish,
        prompt_tokens=len(item.prompt_token_ids),
        completion_tokens=tokens * s.n,
        logprobs=logprobs,
        extra_choices=(Choice(text, finish, logprobs),) * (s.n - 1),
    )


def structured_reply(fmt: ResponseFormat, custom_id: str | None = None) -> str:
    """The echo engine's answer to a ``response_format``: the schema's minimal instance
    (``{}`` for json_object), compact JSON; 4002 when no instance can be built."""
    schema = json.loads(fmt.schema) if fmt.type == "json_schema" else {"type": "object"}
    try:
        value = minimal_instance(schema)
    except NoInstance as exc:
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"response_format: the echo engine cannot answer this schema: {exc}",
            custom_id,
            param="response_format",
        ) from exc
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reply(item: EngineInput) -> tuple[str, FinishReason, int]:
    """(text, finish reason, generated tokens) of one choice."""
    fmt = item.sampling.response_format
    if fmt.type != "text":
        reply = structured_reply(fmt)
    else:
        reply = reply_text(bytes(item.prompt_token_ids).decode("utf-8", "replace"))
    limit = item.sampling.max_tokens
    data = reply.encode()
    hits = [(reply.find(s), s) for s in item.sampling.stop if s in reply]
    if hits:
        cut, stop = min(hits, key=lambda hit: hit[0])
        # a model emits the stop string's tokens before it notices them
        through_stop = len(reply[:cut].encode()) + len(stop.encode())
        if through_stop <= limit:
            return reply[:cut], "stop", through_stop
    if len(data) > limit:
        return data[:limit].decode("utf-8", "ignore"), "length", limit
    return reply, "stop", len(data)


def encode_echo(request: InferenceRequest) -> tuple[int, ...]:
    """The echo engines' tokens: the prompt's UTF-8 bytes, a chat rendered first.

    A ``response_format`` whose minimal instance cannot be built is a 4002 here, at
    admission."""
    fmt = request.sampling.response_format
    if fmt.type != "text":
        structured_reply(fmt, request.custom_id)
    if request.prompt_token_ids:
        if any(not 0 <= t <= 255 for t in request.prompt_token_ids):
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                "the echo engine's tokens are UTF-8 bytes: prompt_token_ids must be in 0..255",
                request.custom_id,
            )
        return tuple(request.prompt_token_ids)
    if request.messages:
        text = render_chat([(m.role, m.content) for m in request.messages])
    else:
        text = request.prompt or ""
    if not text:
        raise RequestError(ErrorCode.INVALID_PARAMETER, "empty prompt", request.custom_id)
    return tuple(text.encode())


class EchoEngine(StaticEngine):
    """Echoes prompts back; each input completes after its own simulated decoding time."""

    honours = frozenset({"stop", "n", "logprobs", "top_logprobs", "response_format"})
    # its one possible answer has no distribution for these to shape
    inert = frozenset(
        {"temperature", "top_p", "top_k", "seed"}
        | {"presence_penalty", "frequency_penalty", "repetition_penalty"}
    )

    def __init__(
        self,
        *,
        delay_per_batch_s: float = 0.0,
        delay_per_token_s: float = 0.0,
        delay_per_seq_token_s: float = 0.0,
    ) -> None:
        self.model_name = "echo"
        self._delay_per_batch_s = delay_per_batch_s
        self._delay_per_token_s = delay_per_token_s
        self._delay_per_seq_token_s = delay_per_seq_token_s
        self._meter = BusyMeter()

    def load(self) -> None:
        """Nothing to load."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return encode_echo(request)

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        with self._meter.busy():
            completions = [echo_completion(item) for item in inputs]
            start = time.monotonic()
            # every row stays in every step until the batch ends, finished or not
            step_s = self._delay_per_token_s + self._delay_per_seq_token_s * len(inputs)
            # a static batch decodes all rows together: shorter answers are ready first
            for completion in sorted(completions, key=lambda c: c.completion_tokens):
                due = start + self._delay_per_batch_s + step_s * completion.completion_tokens
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                on_complete(completion)

    def utilization(self) -> float:
        return self._meter.fraction()
