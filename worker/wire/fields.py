"""Every request-body field batchpipe knows, and what it does with each: the one table.

Nothing in a body is silently ignored. :func:`worker.wire.batchline.parse_line` refuses
(4002, naming the field) every key this table does not list for the line's endpoint, and
every ``refused`` field set to a value that asks for something (``stream: true``, a
``tools`` list); ``null`` always means absent. ``engine`` fields depend on the engine:
the worker refuses, at admission, those its engine does not honour
(:mod:`worker.engines.support`, which also renders the per-engine table of
``docs/fields.md``).

Treatments:

* ``honoured`` — every engine applies it.
* ``engine`` — applied by the engines that declare it (``Engine.honours``); the others
  refuse it when it asks for something (4002 at admission).
* ``informational`` — accepted and not acted upon; it changes nothing in the answer.
* ``refused`` — 4002 unless its value is one of ``neutral`` (values that ask for nothing).

The fields are those of the official ``openai`` SDK's ``CompletionCreateParams`` for
``/v1/chat/completions`` and ``/v1/completions``, ``EmbeddingCreateParams`` for
``/v1/embeddings`` and ``ResponseCreateParams`` for ``/v1/responses``, plus batchpipe's
extensions (``tests/unit/worker/wire/test_fields.py`` walks both lists against the
parser). A name may have one row per meaning: ``input`` is embedding texts for
``/v1/embeddings`` and message items for ``/v1/responses``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.wire.messages import Endpoint

Treatment = Literal["honoured", "engine", "informational", "refused"]

CHAT: frozenset[Endpoint] = frozenset({"chat"})
TEXT: frozenset[Endpoint] = frozenset({"completions"})
BOTH: frozenset[Endpoint] = CHAT | TEXT
EMBED: frozenset[Endpoint] = frozenset({"embeddings"})
RESP: frozenset[Endpoint] = frozenset({"responses"})
#: the endpoints that generate text
GENERATE: frozenset[Endpoint] = BOTH | RESP
ALL: frozenset[Endpoint] = GENERATE | EMBED
#: chat and responses: the fields the two message endpoints share
MESSAGES: frozenset[Endpoint] = CHAT | RESP


@dataclass(frozen=True)
class BodyField:
    """One body field: the endpoints that take it, its treatment and what it does."""

    name: str
    endpoints: frozenset[Endpoint]
    treatment: Treatment
    note: str
    #: refused fields: values that ask for nothing, accepted (compared with their JSON type)
    neutral: tuple[object, ...] = ()
    #: not an OpenAI field: a batchpipe (or vLLM-style) extension
    extension: bool = False
    #: the sampling setting it maps onto when named otherwise (``text`` sets
    #: ``response_format``): the name engines declare in ``honours``
    setting: str = ""

    @property
    def engine_name(self) -> str:
        """The name an engine honours this field under."""
        return self.setting or self.name

    def asks_nothing(self, value: object) -> bool:
        """True for null and for the neutral values (``False`` is not ``0`` here)."""
        return value is None or any(type(value) is type(ok) and value == ok for ok in self.neutral)


def _f(
    name: str,
    endpoints: frozenset[Endpoint],
    treatment: Treatment,
    note: str,
    *neutral: object,
    extension: bool = False,
    setting: str = "",
) -> BodyField:
    return BodyField(name, endpoints, treatment, note, neutral, extension, setting)


_TOOLS = "tools and function calling are not implemented"

FIELDS: tuple[BodyField, ...] = (
    _f(
        "model",
        ALL,
        "honoured",
        "the worker's model name; empty or absent: the worker's; another: 4002",
    ),
    _f("messages", CHAT, "honoured", "rendered by the model's chat template; text content only"),
    _f("prompt", TEXT, "honoured", "a string or a list of token ids"),
    _f("max_tokens", BOTH, "honoured", "the most tokens to generate per choice"),
    _f(
        "max_completion_tokens",
        CHAT,
        "honoured",
        "same as max_tokens (both given: they must agree)",
    ),
    _f("temperature", GENERATE, "engine", "0 is greedy decoding"),
    _f("top_p", GENERATE, "engine", "nucleus sampling"),
    _f("seed", BOTH, "engine", "the sampling generator's seed; choice i of n uses seed + i"),
    _f("stop", BOTH, "engine", "up to 16 strings; the text ends before the first one"),
    _f("presence_penalty", BOTH, "engine", "OpenAI's definition, over the generated tokens"),
    _f("frequency_penalty", BOTH, "engine", "OpenAI's definition, over the generated tokens"),
    _f("n", BOTH, "engine", "n choices in one result line (1..128)"),
    _f("logprobs", BOTH, "engine", "chat: true; completions: the number of alternatives (0..5)"),
    _f("top_logprobs", CHAT, "engine", "alternatives per token (0..20); needs logprobs: true"),
    _f("response_format", CHAT, "engine", "text, json_object or json_schema, by guided decoding"),
    _f("metadata", MESSAGES, "honoured", "string tags returned on the result"),
    _f("user", ALL, "informational", "an end-user id; accepted, not used"),
    _f("safety_identifier", MESSAGES, "informational", "an end-user id; accepted, not used"),
    _f("prompt_cache_key", MESSAGES, "informational", "shared prefixes are cached without a key"),
    _f(
        "service_tier",
        MESSAGES,
        "refused",
        "only auto or default: batchpipe has priority",
        "auto",
        "default",
    ),
    _f("store", MESSAGES, "refused", "nothing is stored but the result", False),
    _f("stream", GENERATE, "refused", "a batch answers whole results, never a stream", False),
    _f("stream_options", GENERATE, "refused", "only with stream"),
    _f("tools", MESSAGES, "refused", _TOOLS, []),
    _f("tool_choice", MESSAGES, "refused", _TOOLS, "none"),
    _f("parallel_tool_calls", MESSAGES, "refused", _TOOLS),
    _f("functions", CHAT, "refused", _TOOLS, []),
    _f("function_call", CHAT, "refused", _TOOLS, "none"),
    _f("logit_bias", BOTH, "refused", "not implemented", {}),
    _f("modalities", CHAT, "refused", "text output only", ["text"]),
    _f("audio", CHAT, "refused", "text output only"),
    _f("prediction", CHAT, "refused", "predicted outputs are not implemented"),
    _f("reasoning_effort", CHAT, "refused", "use enable_thinking"),
    _f("verbosity", CHAT, "refused", "not implemented"),
    _f("web_search_options", CHAT, "refused", "no web search"),
    _f("moderation", MESSAGES, "refused", "no moderation"),
    _f("prompt_cache_retention", MESSAGES, "refused", "prefixes live in an LRU", "in_memory"),
    _f("prompt_cache_options", MESSAGES, "refused", "prefixes live in an LRU"),
    _f("best_of", TEXT, "refused", "only 1; use n", 1),
    _f("echo", TEXT, "refused", "the prompt is not echoed back", False),
    _f("suffix", TEXT, "refused", "no insertion mode", ""),
    _f("input", EMBED, "honoured", "a string or a list of up to 2048 non-empty strings"),
    _f(
        "encoding_format",
        EMBED,
        "honoured",
        "float (JSON numbers) or base64 (little-endian float32 bytes)",
    ),
    _f(
        "dimensions",
        EMBED,
        "engine",
        "only the model's own size (384 for all-MiniLM-L6-v2); shortening needs a "
        "Matryoshka model, none is served",
    ),
    _f(
        "input",
        RESP,
        "honoured",
        "a string (one user message) or message items: roles user, system, developer, "
        "assistant; input_text and (assistant) output_text parts; other items and parts: 4002",
    ),
    _f("instructions", RESP, "honoured", "a system message placed before the input"),
    _f(
        "max_output_tokens",
        RESP,
        "honoured",
        "the most tokens to generate (max_tokens)",
        setting="max_tokens",
    ),
    _f(
        "text",
        RESP,
        "engine",
        "format: text, json_object or json_schema, by guided decoding (as response_format); "
        "verbosity: 4002",
        setting="response_format",
    ),
    _f("top_logprobs", RESP, "refused", "output logprobs are not implemented here", 0),
    _f("include", RESP, "refused", "no extra output data is produced", []),
    _f("reasoning", RESP, "refused", "use enable_thinking on /v1/chat/completions"),
    _f("previous_response_id", RESP, "refused", "responses are not stored; send the input"),
    _f("conversation", RESP, "refused", "conversations are not stored; send the input"),
    _f("prompt", RESP, "refused", "prompt templates are not stored; send the input"),
    _f("background", RESP, "refused", "a batch line always runs in the background", False),
    _f("max_tool_calls", RESP, "refused", _TOOLS),
    _f("truncation", RESP, "refused", "an input over the limits is 4003", "disabled"),
    _f("context_management", RESP, "refused", "not implemented"),
    _f("background_options", RESP, "refused", "not implemented"),
    _f("access_programs", RESP, "refused", "not implemented"),
    _f("image", RESP, "refused", "text output only"),
    _f("top_k", BOTH, "engine", "sample among the k likeliest tokens", extension=True),
    _f("repetition_penalty", BOTH, "engine", "transformers' definition", extension=True),
    _f("enable_thinking", BOTH, "honoured", "rendered by the chat template", extension=True),
    _f(
        "chat_template_kwargs",
        BOTH,
        "honoured",
        "only enable_thinking; another key: 4002",
        extension=True,
    ),
)

BY_ENDPOINT: dict[tuple[str, Endpoint], BodyField] = {
    (field.name, endpoint): field for field in FIELDS for endpoint in field.endpoints
}


def body_field(name: str, endpoint: Endpoint) -> BodyField | None:
    """The field ``name`` of ``endpoint``'s body, None when that body has no such field."""
    return BY_ENDPOINT.get((name, endpoint))
