"""Domain objects that cross module boundaries: requests, results and their parts.

These are the in-process form of the wire contract in ``proto/batchpipe/v1``;
only :mod:`worker.wire.codec` converts between them and protobuf or JSON.

They are frozen ``msgspec.Struct`` classes, not dataclasses: one is built for every
request and answer, and a Struct is built, compared and read faster (issue 42, measured
in docs/architecture.md section 2). They compare, hash, pickle and print like frozen
dataclasses. A copy with some fields changed is ``msgspec.structs.replace(value, **changes)``
and the field names are ``type(value).__struct_fields__`` (``msgspec.structs.fields``
gives their ``FieldInfo``; ``dataclasses.replace`` and ``dataclasses.fields`` refuse
them); the fields as a dict are ``msgspec.structs.asdict``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, TypeVar

import msgspec

Role = Literal["system", "user", "assistant", "tool", "developer"]
#: content_filter: a remote server's filter cut the answer (engine.kind openai passes it on)
FinishReason = Literal["stop", "length", "content_filter", "error"]
Status = Literal["completed", "failed"]
#: The OpenAI endpoint a request addressed; it decides the shape of the answer's body.
Endpoint = Literal["chat", "completions", "embeddings", "responses"]
#: How an embeddings answer writes its vectors (OpenAI's ``encoding_format``): JSON numbers,
#: or base64 of their little-endian float32 bytes.
EncodingFormat = Literal["float", "base64"]
#: One embedding vector per input text of a request.
Embeddings = tuple[tuple[float, ...], ...]


def _frozen(mapping: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping or {}))


class ChatMessage(msgspec.Struct, frozen=True):
    role: str
    content: str


ResponseFormatType = Literal["text", "json_object", "json_schema"]


class ResponseFormat(msgspec.Struct, frozen=True):
    """The shape the output must take (OpenAI's ``response_format``).

    ``text``: free text (the default). ``json_object``: one JSON object. ``json_schema``:
    JSON valid against ``schema`` (the JSON Schema as JSON text; ``name`` and ``strict``
    as the request gave them).
    """

    type: ResponseFormatType = "text"
    schema: str = ""
    name: str = ""
    strict: bool | None = None

    @property
    def constraint(self) -> str:
        """The JSON Schema (JSON text) a guided decoder compiles: ``schema``, or for
        ``json_object`` one object with any members; "" for ``text``."""
        if self.type == "json_object":
            return '{"type": "object"}'
        return self.schema if self.type == "json_schema" else ""

    @property
    def strict_mode(self) -> bool:
        """Compile in strict mode (no members beyond those listed) unless the request
        said ``strict: false`` for its schema."""
        return self.type == "json_schema" and self.strict is not False


class SamplingParams(msgspec.Struct, frozen=True):
    """Generation settings as requested. ``None`` means unset: the worker's configured
    default for ``max_tokens`` and ``temperature``, the setting off for the others.

    Resolved once, at admission, into :class:`~worker.engines.base.ResolvedSampling`.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat = ResponseFormat()


K = TypeVar("K")
V = TypeVar("V")

#: the most bytes (of the protobuf message) or characters (of a schema and stop strings)
#: that settings may have and still be kept in a table shared by the requests asking for
#: the same: a tenant can make each value megabytes, and a table keeps values after their
#: requests are answered
SETTINGS_KEPT_BYTES = 1024


def keeps(sampling: SamplingParams) -> bool:
    """Whether ``sampling`` is small enough to keep (:data:`SETTINGS_KEPT_BYTES`): only its
    schema and stop strings can be long."""
    fmt = sampling.response_format
    size = len(fmt.schema) + len(fmt.name) + sum(map(len, sampling.stop))
    return size <= SETTINGS_KEPT_BYTES


def remember(table: dict[K, V], key: K, value: V, most: int) -> None:
    """``table[key] = value``, the table started again once it holds ``most``: a bound on
    what requests that each ask for something different can make a shared table keep."""
    if len(table) >= most:
        table.clear()
    table[key] = value


class InferenceRequest(msgspec.Struct, frozen=True):
    """One request. Exactly one of ``messages``, ``prompt``, ``prompt_token_ids`` or
    ``embedding_inputs`` is set; ``encoding_format`` and ``dimensions`` belong to the last
    (``/v1/embeddings``), ``sampling`` and ``enable_thinking`` to the others.

    ``responses`` marks messages that came as a ``/v1/responses`` request: the engines run
    them as chat messages, and only the answer differs (a ``response`` object).
    """

    custom_id: str
    batch_id: str = ""
    batch_total: int = 0
    model: str = ""
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    sampling: SamplingParams = SamplingParams()
    enable_thinking: bool | None = None
    metadata: Mapping[str, str] = msgspec.field(default_factory=_frozen)
    priority: int = 0
    deadline: float | None = None  # unix seconds
    submitted_at: float | None = None  # unix seconds
    embedding_inputs: tuple[str, ...] = ()
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    responses: bool = False

    @property
    def endpoint(self) -> Endpoint:
        """``responses`` when marked so (``/v1/responses``), ``chat`` for messages
        (``/v1/chat/completions``), ``embeddings`` for embedding inputs
        (``/v1/embeddings``), else ``completions``."""
        if self.responses:
            return "responses"
        if self.messages:
            return "chat"
        return "embeddings" if self.embedding_inputs else "completions"


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenLogprob(msgspec.Struct, frozen=True):
    """One generated token: its text, its log probability, the likeliest tokens there."""

    token: str
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


#: a choice's logprobs: one entry per generated token; None when the request asked for none
Logprobs = tuple[TokenLogprob, ...] | None


class Choice(msgspec.Struct, frozen=True):
    """One completion of a request; a request with ``n`` > 1 has ``n`` of them."""

    text: str
    finish_reason: FinishReason = "stop"
    logprobs: Logprobs = None


class ErrorInfo(msgspec.Struct, frozen=True):
    """An error's code, its message and the request field at fault ("" when none is)."""

    code: int
    message: str
    param: str = ""


class Timings(msgspec.Struct, frozen=True):
    """Seconds spent by a request: waiting for admission, in the batcher, in the engine."""

    queued_s: float = 0.0
    batch_wait_s: float = 0.0
    engine_s: float = 0.0


class InferenceResult(msgspec.Struct, frozen=True):
    """The one answer to a request: a completion (``status == "completed"``) or an error.

    ``text``, ``finish_reason`` and ``logprobs`` are the first choice's; a request with
    ``n`` > 1 has the others in ``extra_choices`` (:attr:`choices` lists them all).
    ``usage.completion_tokens`` counts the tokens of every choice, as OpenAI does.
    An embeddings result has no text: ``embeddings`` holds one vector per input, written
    in the answer as ``encoding_format`` says.
    """

    custom_id: str
    batch_id: str = ""
    batch_total: int = 0
    metadata: Mapping[str, str] = msgspec.field(default_factory=_frozen)
    status: Status = "completed"
    text: str = ""
    finish_reason: FinishReason = "stop"
    usage: Usage = Usage()
    error: ErrorInfo | None = None
    timings: Timings = Timings()
    batch_size: int = 0
    model: str = ""
    worker_id: str = ""
    created_at: float = 0.0  # unix seconds, when the worker produced it
    endpoint: Endpoint = "chat"
    logprobs: Logprobs = None  # the first choice's, like text and finish_reason
    extra_choices: tuple[Choice, ...] = ()  # choices 1 .. n-1 when n > 1
    embeddings: Embeddings = ()
    encoding_format: EncodingFormat = "float"

    @property
    def choices(self) -> tuple[Choice, ...]:
        """Every choice, the first one (``text``, ``finish_reason``, ``logprobs``) first."""
        return (Choice(self.text, self.finish_reason, self.logprobs), *self.extra_choices)

    @property
    def result_id(self) -> str:
        """Stable id derived from (batch_id, custom_id): duplicates share it."""
        return result_id(self.batch_id, self.custom_id)


def result_id(batch_id: str, custom_id: str) -> str:
    digest = hashlib.sha256(f"{batch_id}\x00{custom_id}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"
