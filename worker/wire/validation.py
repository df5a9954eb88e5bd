"""The one set of value rules for a request, whichever wire form it arrived in.

:func:`validate_request` runs on every decoded request — protobuf or JSON batch line —
so both forms accept and reject exactly the same values. Ranges follow the OpenAI chat
completions API; the integer bounds are those of the protobuf fields, and every string must
be encodable as UTF-8 (as protobuf and Kafka headers require), so every request that passes
can be encoded.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Iterator

import jsonschema

from worker.errors import ErrorCode, RequestError
from worker.wire.messages import InferenceRequest, SamplingParams, keeps, remember

ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
#: the roles of a /v1/responses input message
RESPONSES_ROLES = ROLES - {"tool"}
MAX_STOP = 16
MAX_N = 128  # OpenAI's bound on n
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's bound on the texts of one embeddings request
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: the deepest a ``response_format`` schema's JSON may nest: far beyond a real schema
#: (OpenAI's structured outputs allow 10 levels of schema nesting, about 20 of JSON), far
#: below what the parser and the schema checker recurse through
MAX_SCHEMA_DEPTH = 64


# The only code points UTF-8 cannot encode. JSON can still carry them (``"\ud800"``), and
# protobuf raises UnicodeEncodeError on them: found at decode time, they are a bad request.
_SURROGATE = re.compile(f"[{chr(0xD800)}-{chr(0xDFFF)}]")  # chr(): mypyc refuses the literal


def escaped(text: str) -> str:
    """``text`` with every lone surrogate written out as ``\\udXXX``: encodable as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_custom_id(custom_id: str) -> None:
    """4001 for a ``custom_id`` that UTF-8 cannot encode, answered under its escaped form.

    Run before anything else that may fail with this id, so that no answer carries it raw.
    """
    if _SURROGATE.search(custom_id):
        raise RequestError(
            ErrorCode.MALFORMED,
            "custom_id holds a lone surrogate, which UTF-8 cannot encode "
            "(the answer carries it escaped)",
            escaped(custom_id),
        )


def _texts(req: InferenceRequest) -> Iterator[tuple[str, object, str]]:
    """``(field name template, its argument, text)`` of every string of ``req`` besides
    ``custom_id``; the name (``template.format(argument)``) is made only when needed."""
    yield "batch_id", None, req.batch_id
    yield "model", None, req.model
    if req.prompt is not None:
        yield "prompt", None, req.prompt
    for i, message in enumerate(req.messages):
        yield "messages[{}].role", i, message.role
        yield "messages[{}].content", i, message.content
    for i, text in enumerate(req.embedding_inputs):
        yield "input[{}]", i, text
    for i, stop in enumerate(req.sampling.stop):
        yield "stop[{}]", i, stop
    yield "response_format.json_schema.name", None, req.sampling.response_format.name
    yield "response_format.json_schema.schema", None, req.sampling.response_format.schema
    for key, value in req.metadata.items():
        yield "a metadata key", None, key
        yield "metadata[{!r}]", key, value


def _check_text(req: InferenceRequest) -> None:
    check_custom_id(req.custom_id)
    texts = list(_texts(req))
    # one search over them all (a surrogate is one code point: joining makes or hides
    # none); only a hit walks them again to name the field
    if not _SURROGATE.search("".join(text for _, _, text in texts)):
        return
    for template, argument, text in texts:
        if _SURROGATE.search(text):
            raise RequestError(
                ErrorCode.MALFORMED,
                f"{template.format(argument)} holds a lone surrogate, which UTF-8 cannot encode",
                req.custom_id,
            )


def _invalid(req: InferenceRequest, message: str, param: str | None = None) -> RequestError:
    return RequestError(ErrorCode.INVALID_PARAMETER, message, req.custom_id, param=param)


def _check_float(
    req: InferenceRequest,
    name: str,
    value: float | None,
    low: float,
    high: float,
    *,
    low_open: bool = False,
) -> None:
    if value is None:
        return
    too_low = value <= low if low_open else value < low
    if not math.isfinite(value) or too_low or value > high:
        bracket = "(" if low_open else "["
        raise _invalid(req, f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r}", name)


def _check_int(req: InferenceRequest, name: str, value: int | None, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise _invalid(req, f"{name} must be between {low} and {high}, got {value}", name)


def _check_input(req: InferenceRequest) -> None:
    given = [
        name
        for name, present in (
            ("messages", bool(req.messages)),
            ("prompt", req.prompt is not None),
            ("prompt_token_ids", bool(req.prompt_token_ids)),
            ("input", bool(req.embedding_inputs)),
        )
        if present
    ]
    if not given:
        raise _invalid(
            req, "the request has no input: give messages, a prompt, token ids or embedding input"
        )
    if len(given) > 1:
        raise _invalid(req, f"give exactly one input, got {' and '.join(given)}")
    for message in req.messages:
        if message.role not in ROLES:
            raise _invalid(
                req, f"message role {message.role!r} is not one of {', '.join(sorted(ROLES))}"
            )
    if any(not 0 <= token <= INT32_MAX for token in req.prompt_token_ids):
        raise _invalid(req, f"prompt_token_ids must be between 0 and {INT32_MAX}")


def _check_output_options(req: InferenceRequest) -> None:
    """n, logprobs and response_format: their ranges and the combinations OpenAI allows."""
    s = req.sampling
    _check_int(req, "n", s.n, 1, MAX_N)
    _check_int(req, "top_logprobs", s.top_logprobs, 0, MAX_TOP_LOGPROBS)
    if s.top_logprobs is not None and not s.logprobs:
        raise _invalid(req, "top_logprobs needs logprobs: true", "top_logprobs")
    fmt = s.response_format
    if fmt.type == "text":
        if fmt.schema or fmt.name or fmt.strict is not None:
            raise _invalid(req, "response_format text takes no schema", "response_format")
        return
    if req.endpoint not in ("chat", "responses"):
        raise _invalid(req, "response_format is a chat completions field", "response_format")
    if fmt.type == "json_object" and (fmt.schema or fmt.name):
        raise _invalid(req, "response_format json_object takes no schema", "response_format")
    if fmt.type == "json_schema":
        if not fmt.name:
            raise _invalid(req, "response_format json_schema needs a name", "response_format")
        problem = schema_problem(fmt.schema)
        if problem:
            raise _invalid(req, f"response_format json_schema.schema: {problem}", "response_format")


#: the sampling settings a /v1/responses body can set (max_output_tokens, temperature,
#: top_p, text.format); the Responses API has none of the others
RESPONSES_SETTINGS = frozenset({"max_tokens", "temperature", "top_p", "response_format"})


def _check_responses(req: InferenceRequest) -> None:
    """A /v1/responses request holds what its body can say: messages of the roles it
    takes, and only the settings it has (a protobuf producer could set the others)."""
    if not req.responses:
        return
    if not req.messages:
        raise _invalid(req, "a /v1/responses request takes input messages", "input")
    for message in req.messages:
        if message.role not in RESPONSES_ROLES:
            roles = ", ".join(sorted(RESPONSES_ROLES))
            raise _invalid(req, f"input role {message.role!r} is not one of {roles}", "input")
    unset = SamplingParams()
    asked = [
        name
        for name in SamplingParams.__struct_fields__
        if name not in RESPONSES_SETTINGS and getattr(req.sampling, name) != getattr(unset, name)
    ]
    asked += ["enable_thinking"] if req.enable_thinking is not None else []
    if asked:
        raise _invalid(req, f"{asked[0]} is not a /v1/responses field", asked[0])


def _check_embeddings(req: InferenceRequest) -> None:
    """The embeddings options belong to embeddings requests, generation settings to the
    others; OpenAI's bounds on the input texts."""
    if req.endpoint != "embeddings":
        if req.encoding_format != "float":
            raise _invalid(req, "encoding_format is a /v1/embeddings field", "encoding_format")
        if req.dimensions is not None:
            raise _invalid(req, "dimensions is a /v1/embeddings field", "dimensions")
        return
    unset = SamplingParams()
    asked = [
        name
        for name in SamplingParams.__struct_fields__
        if getattr(req.sampling, name) != getattr(unset, name)
    ]
    asked += ["enable_thinking"] if req.enable_thinking is not None else []
    if asked:
        raise _invalid(
            req, f"{asked[0]} is a generation setting: /v1/embeddings takes none", asked[0]
        )
    if len(req.embedding_inputs) > MAX_EMBEDDING_INPUTS:
        raise _invalid(
            req, f"input holds more than {MAX_EMBEDDING_INPUTS} texts, OpenAI's limit", "input"
        )
    if not all(req.embedding_inputs):
        raise _invalid(req, "input texts must not be empty", "input")
    _check_int(req, "dimensions", req.dimensions, 1, INT32_MAX)


@functools.lru_cache(maxsize=256)
def schema_problem(text: str) -> str:
    """Why ``text`` is not a JSON Schema object ("" when it is one); cached per schema.

    Nesting is bounded (:data:`MAX_SCHEMA_DEPTH`) before anything walks the schema
    recursively: ``[`` × 3,000 made the parser raise ``RecursionError``, which no request
    error catches, and the worker crashed on the record, and again on every restart."""
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    if nesting(schema) > MAX_SCHEMA_DEPTH:
        return f"nested deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message}"
    return ""


def nesting(value: object) -> int:
    """How deep ``value``'s arrays and objects nest (1 for a flat one, 0 for a scalar),
    counted without recursion and no further than one level past :data:`MAX_SCHEMA_DEPTH`."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_SCHEMA_DEPTH:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def validate_request(req: InferenceRequest, *, utf8: bool = False, shared: bool = False) -> None:
    """Raise :class:`RequestError` unless every value of ``req`` is acceptable.

    ``utf8``: every string of ``req`` was decoded from bytes already found to be valid
    UTF-8 (protobuf refuses a string field that is not while parsing), so none holds a
    lone surrogate and the search for one is skipped.

    ``shared``: ``req.sampling`` may be a value the codec hands to every request asking
    for the same settings, so its check is remembered (if small: :func:`keeps`); a value
    made for one request (a JSON line's) never recurs, and is checked without being kept.

    4001 for a missing ``custom_id`` (without ``custom_id`` set on the error, since
    there is none to answer to); 4001 for text that UTF-8 cannot encode, naming the field
    and carrying ``custom_id`` escaped if it is the culprit (:func:`check_custom_id`);
    4002, carrying ``req.custom_id``, for a value out of range, a missing or ambiguous
    input, an unknown message role, or options of another endpoint (sampling on an
    embeddings request, ``encoding_format`` or ``dimensions`` on a generation one, a
    setting the Responses API lacks on a /v1/responses one).
    Limits that depend on the worker (tokens, model name) are checked by the worker.
    """
    if not req.custom_id:
        raise RequestError(ErrorCode.MALFORMED, "custom_id is missing or empty")
    if not utf8:
        _check_text(req)
    _check_input(req)
    s = req.sampling
    if _CHECKED.get(id(s)) is not s:
        _check_sampling(req, s)
        if shared and keeps(s):  # held here, so its id names no other object while kept
            remember(_CHECKED, id(s), s, _CHECKED_KEPT)
    _check_output_options(req)
    _check_embeddings(req)
    _check_responses(req)
    _check_int(req, "batch_total", req.batch_total, 0, INT32_MAX)
    _check_int(req, "priority", req.priority, -INT32_MAX - 1, INT32_MAX)
    for name, when in (("deadline", req.deadline), ("submitted_at", req.submitted_at)):
        if when is not None and not (math.isfinite(when) and when >= 0):
            raise _invalid(req, f"{name} must be unix seconds (a finite number >= 0)")


#: sampling settings whose values passed :func:`_check_sampling`, by id (each held here,
#: so its id is its own): the codec hands requests that ask for the same settings one
#: shared value, checked once (issue 42); an equal value that is another object is
#: checked anew. Only shared, small values are kept (``validate_request``'s ``shared``)
_CHECKED: dict[int, SamplingParams] = {}
_CHECKED_KEPT = 256


def _check_sampling(req: InferenceRequest, s: SamplingParams) -> None:
    """The ranges of ``s``'s values (4002 naming the field): they depend on ``s`` alone."""
    _check_int(req, "max_tokens", s.max_tokens, 1, INT32_MAX)
    _check_float(req, "temperature", s.temperature, 0.0, 2.0)
    _check_float(req, "top_p", s.top_p, 0.0, 1.0, low_open=True)
    _check_int(req, "top_k", s.top_k, 0, INT32_MAX)
    _check_int(req, "seed", s.seed, INT64_MIN, INT64_MAX)
    _check_float(req, "presence_penalty", s.presence_penalty, -2.0, 2.0)
    _check_float(req, "frequency_penalty", s.frequency_penalty, -2.0, 2.0)
    _check_float(req, "repetition_penalty", s.repetition_penalty, 0.0, math.inf, low_open=True)
    if len(s.stop) > MAX_STOP or any(not stop for stop in s.stop):
        raise _invalid(req, f"stop must hold at most {MAX_STOP} non-empty strings", "stop")
