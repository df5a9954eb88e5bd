"""decode → admit: turn a consumed record into a batchable job, or into its answer.

Every record ends in exactly one of three outcomes: a :class:`Job` for the batcher, an
error result for the results topic (a ``custom_id`` could be recovered), or a
dead-letter record (it could not). Nothing here raises for bad input.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter

from msgspec import structs

from batcher import Pending, prefix_key_of
from worker.config import BatchingConfig, GenerationConfig
from worker.engines.base import Engine, EngineInput, ResolvedSampling
from worker.engines.support import refused_field, unsupported
from worker.errors import ErrorCode, RequestError
from worker.feeder.headers import tag_of
from worker.loop.jobs import Identity, Job, Source, failed
from worker.wire.batchline import URLS
from worker.wire.codec import CodecLimits, Headers, decode_request
from worker.wire.messages import (
    Endpoint,
    InferenceRequest,
    InferenceResult,
    SamplingParams,
    keeps,
    remember,
)
from worker.wire.responses import named_for_responses

_URL_OF: dict[Endpoint, str] = {endpoint: url for url, endpoint in URLS.items()}
#: an embeddings request's settings, shared: it generates nothing and asks for no field
_PROMPT_ONLY = ResolvedSampling.prompt_only()
#: distinct request settings kept resolved; past it the table starts again (a bound on what
#: requests that each set something different can make it hold)
RESOLVED_KEPT = 256


@dataclass(frozen=True)
class DeadLetter:
    """A record no result can be addressed to: republished with its error."""

    source: Source
    value: bytes | None
    headers: tuple[tuple[str, bytes | str | None], ...]
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Rejection:
    """A request answered with an error without running (its ``custom_id`` is known)."""

    result: InferenceResult
    submitted_at: float | None


Outcome = Pending[Job] | Rejection | DeadLetter


class Intake:
    """Decodes, validates and tokenizes records for one engine under one set of limits."""

    def __init__(
        self,
        engine: Engine,
        identity: Identity,
        batching: BatchingConfig,
        generation: GenerationConfig,
        limits: CodecLimits,
    ) -> None:
        self._engine = engine
        self._identity = identity
        self._batching = batching
        self._generation = generation
        self._limits = limits
        #: (sampling, enable_thinking) -> its resolved settings and the field the engine
        #: refuses: most requests of a batch ask for the same, resolved and checked once
        self._resolved: dict[
            tuple[SamplingParams, bool | None], tuple[ResolvedSampling, str | None]
        ] = {}

    def take(
        self, source: Source, value: bytes | None, headers: Headers | None, now: float
    ) -> Outcome:
        """The outcome of one record consumed at ``now`` (monotonic seconds)."""
        request: InferenceRequest | None = None
        try:
            request = decode_request(value, headers, self._limits)
            return self._admit(request, source, now, tag_of(headers))
        except RequestError as exc:
            if request is not None and request.responses:
                exc = named_for_responses(exc)  # the field as the line named it
            custom_id = exc.custom_id or (request.custom_id if request else None)
            if not custom_id:
                return DeadLetter(source, value, _pairs(headers), exc.code, exc.message)
            result = failed(
                custom_id,
                exc.code,
                exc.message,
                identity=self._identity,
                request=request,
                param=exc.param,
            )
            if request is None:  # rejected while decoding: still an answer in its batch
                result = structs.replace(result, batch_id=exc.batch_id, batch_total=exc.batch_total)
            return Rejection(result, request.submitted_at if request else None)

    def _admit(
        self, request: InferenceRequest, source: Source, now: float, tag: float | None = None
    ) -> Pending[Job]:
        served = self._identity.model
        if request.model not in ("", served):
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"model {request.model!r} is not served here; this worker serves {served!r}",
                request.custom_id,
                param="model",
            )
        if request.endpoint not in self._engine.endpoints:
            urls = ", ".join(url for url, e in URLS.items() if e in self._engine.endpoints)
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"{_URL_OF[request.endpoint]} is not served here; this worker's model "
                f"{served!r} serves {urls}",
                request.custom_id,
                param="url",
            )
        wall = time.time()
        if request.deadline is not None and request.deadline < wall:
            raise RequestError(
                ErrorCode.DEADLINE_EXCEEDED,
                f"deadline passed {wall - request.deadline:.3f}s before the request ran",
                request.custom_id,
            )
        sampling = _PROMPT_ONLY if request.endpoint == "embeddings" else self._resolve(request)
        if (request.enable_thinking is True) != sampling.enable_thinking:
            # the chat template renders it; unset reads as off (as the engines read it), so
            # only a configured True makes a copy
            request = structs.replace(request, enable_thinking=sampling.enable_thinking)
        token_ids, inputs = self._tokens(request)
        ref = source.ref
        # n choices are n sequences: each holds the prompt and up to max_tokens
        total = (len(token_ids) + sampling.max_tokens) * sampling.n
        if total > self._batching.max_batch_tokens:
            times = f"{sampling.n} × " if sampling.n > 1 else ""
            raise RequestError(
                ErrorCode.OVER_LIMIT,
                f"{times}(prompt ({len(token_ids)} tokens) + max_tokens ({sampling.max_tokens}))"
                f" = {total} exceeds max_batch_tokens {self._batching.max_batch_tokens}",
                request.custom_id,
            )
        job = Job(
            request=request,
            engine_input=EngineInput(ref, token_ids, sampling, inputs),
            source=source,
            admitted_at=now,
            admitted_wall=wall,
        )
        return Pending(
            key=ref,
            partition=(source.topic, source.partition),
            offset=source.offset,
            prompt_tokens=len(token_ids) * sampling.n,
            max_tokens=sampling.max_tokens * sampling.n,
            arrival=now,
            payload=job,
            priority=request.priority,
            # the batcher's clock is monotonic; a wall-clock deadline is converted once here
            deadline=None if request.deadline is None else now + (request.deadline - wall),
            dedup_key=_dedup_key(token_ids, sampling, inputs) if self._batching.dedup else None,
            # embedding inputs are encoded whole: no KV cache holds a shared prefix
            prefix_key=prefix_key_of(token_ids)
            if self._batching.shared_prefix and not inputs
            else None,
            tag=tag,  # the feeder's, bounded: newcomers first (§10)
        )

    def _resolve(self, request: InferenceRequest) -> ResolvedSampling:
        """``request``'s settings, resolved (:meth:`ResolvedSampling.resolve`) and checked
        against the engine (4002) once per distinct small setting (:func:`keeps`); a seed
        the request did not fix is still drawn for each request."""
        key = (request.sampling, request.enable_thinking)
        kept = keeps(request.sampling)  # a long schema or stop is not kept after its answer
        known = self._resolved.get(key) if kept else None
        if known is None:
            resolved = ResolvedSampling.resolve(*key, self._generation)  # draws the seed
            known = (resolved, refused_field(self._engine, resolved))
            if kept:
                remember(self._resolved, key, known, RESOLVED_KEPT)
        else:
            resolved = known[0].for_another()
        if known[1] is not None:
            raise unsupported(self._engine, known[1], request.custom_id)
        return resolved

    def _tokens(
        self, request: InferenceRequest
    ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        """``(prompt token ids, each embedding input's)``: the engine's tokenizer at work."""
        try:
            if request.endpoint != "embeddings":
                return self._engine.encode(request), ()
            inputs = self._engine.encode_inputs(request)
            return tuple(chain.from_iterable(inputs)), inputs
        except RequestError:
            raise
        except Exception as exc:  # a tokenizer failure is this request's problem only
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"the model cannot take this input: {exc}",
                request.custom_id,
            ) from exc


def _dedup_key(
    token_ids: Sequence[int],
    sampling: ResolvedSampling,
    inputs: Sequence[Sequence[int]] = (),
) -> Hashable | None:
    """Same key ⇔ identical model input (embedding inputs split at the same places) and
    identical deterministic sampling.

    The key is the token ids themselves (the tuple the engine made, shared, not copied),
    every setting and the inputs' lengths: compared exactly, no digest that could collide,
    and hashed in C where a digest first copied every id into a buffer (issue 25).
    """
    if not sampling.deterministic:
        return None
    settings = _SAMPLING_FIELDS(sampling)  # every field, one C call
    if not sampling.seeded:
        # greedy: the seed drawn at admission is unused and differs between identical requests
        settings = (*settings[:_SEED], 0, *settings[_SEED + 1 :])
    return (tuple(token_ids), settings, tuple(len(ids) for ids in inputs))


_NAMES = tuple(f.name for f in fields(ResolvedSampling))
#: every setting of a resolved request, in order: a field added later is in the key too
_SAMPLING_FIELDS = attrgetter(*_NAMES)
_SEED = _NAMES.index("seed")


def _pairs(headers: Headers | None) -> tuple[tuple[str, bytes | str | None], ...]:
    if isinstance(headers, Mapping):
        return tuple(headers.items())
    return tuple(headers or ())
