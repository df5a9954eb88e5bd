"""The engine contract. The worker drives every engine through this interface only.

An engine is fed in one of two ways (docs/architecture.md §3):

* :class:`StaticEngine` (hf, echo): one batch at a time. The worker's batcher decides
  the batch's shape; ``run_batch`` returns when every input of it has finished.
* :class:`InFlightEngine` (vllm, trtllm, echo paced in flight): the engine's own
  scheduler adds and retires sequences at every decoding step. The worker submits
  requests whenever there is room and collects each completion as it finishes, so the
  engine never idles at a batch's tail.

Lifecycle: ``load()`` once (raises :class:`~worker.errors.ModelLoadError` → 5003, the
worker stays not ready), then any number of ``encode()`` and run calls, then ``close()``.

Threading: ``encode()`` is called from the worker's main thread (decode/admit).
``run_batch()`` is called from one dedicated engine thread, never concurrently with
itself. ``submit()``, ``abort()``, ``completions()`` and ``capacity()`` are called from
one worker thread, never concurrently with each other; an in-flight engine runs its
generation on threads (or processes) of its own. ``utilization()`` may be called from
any thread.

Invariants every engine keeps (``tests/unit/worker/engines/test_contract.py`` checks
them on every engine that runs here):

* Each input is completed exactly once — ``on_complete`` for a static engine, an entry
  of ``completions()`` for an in-flight one — unless an in-flight engine was told to
  ``abort`` it first; an aborted key is never completed afterwards. A per-request
  failure is a :class:`Completion` with ``error`` set (:meth:`Completion.failed`: 4003
  when the request is over one of the engine's limits, else 5000), not an exception.
* An exception out of ``run_batch`` means the whole batch failed (for example out of
  memory): nothing of it was completed, and the caller may split and retry it.
  :class:`EngineOutOfMemory` tells the caller to shrink its batches too. An exception
  out of ``submit`` or ``completions`` means the engine itself is broken.
* ``abort`` of a key that is unknown or already completed does nothing.
* Greedy decoding (``temperature == 0``) gives the same text for a request whether it
  runs alone, in a batch, or in flight with others.
* ``Completion.prompt_tokens == len(EngineInput.prompt_token_ids)``, and
  ``completion_tokens`` counts generated tokens up to and including the stop token (stop
  strings included), never padding.
"""

from __future__ import annotations

import random
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from prometheus_client.registry import Collector

from worker.config import GenerationConfig
from worker.errors import BatchpipeError, ErrorCode, RequestError
from worker.wire.messages import (
    Choice,
    Embeddings,
    Endpoint,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    Logprobs,
    ResponseFormat,
    SamplingParams,
)

#: the ``engine`` fields (:mod:`worker.wire.fields`) the engines over a real model (hf,
#: vllm, trtllm) all apply; listed, not derived from the table, so a field added to the
#: table is refused by every engine until one maps it
MODEL_ENGINE_FIELDS = frozenset(
    {"temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs", "top_logprobs"}
    | {"presence_penalty", "frequency_penalty", "repetition_penalty", "response_format"}
)


#: draws the seed of a request that gives none: seeded once per process from the system's
#: entropy, then a plain generator (secrets.randbits was a system call per request, on
#: the hot path); a drawn seed promises the user nothing but reproducibility from the
#: resolved settings
_SEEDS = random.Random(secrets.randbits(128))


@dataclass(frozen=True)
class ResolvedSampling:
    """One request's generation settings with every value decided: what an engine runs.

    Made once at admission by :meth:`resolve`; engines apply no defaults of their own.

    * ``max_tokens``: the most tokens to generate (≥ 1 for requests; 0 generates nothing).
    * ``temperature``: 0.0 is greedy decoding; above 0 samples from the scaled logits.
    * ``top_p``: nucleus sampling mass in (0, 1]; 1.0 = off.
    * ``top_k``: sample among the k most likely tokens; 0 = off.
    * ``seed``: the sampling generator's seed. Drawn at admission when the request gives
      none, so every run is reproducible from its resolved settings.
    * ``seeded``: True when the request fixed ``seed``; a drawn seed promises nothing to
      the user, so only a seeded (or greedy) request counts as deterministic.
    * ``stop``: strings that end the generation, empty strings removed; () = none.
    * ``presence_penalty`` / ``frequency_penalty``: subtracted (OpenAI's definition) from
      the logits of tokens already generated, once / per occurrence; 0.0 = off.
    * ``repetition_penalty``: transformers' definition, over prompt and output; 1.0 = off.
    * ``enable_thinking``: rendered into the prompt by the chat template when the request
      is encoded; recorded here so the settings describe the whole generation.
    * ``n``: choices to generate (≥ 1); choice ``i`` samples with seed ``seed + i``.
    * ``logprobs``: report each generated token's log probability under the model (before
      penalties and temperature) and the ``top_logprobs`` likeliest tokens at it.
    * ``response_format``: the shape the output must take; ``text`` = free text.
    """

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    seeded: bool
    stop: tuple[str, ...]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    enable_thinking: bool
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: ResponseFormat = ResponseFormat()  # noqa: RUF009 — frozen, safe to share

    @classmethod
    def resolve(
        cls, sampling: SamplingParams, enable_thinking: bool | None, defaults: GenerationConfig
    ) -> ResolvedSampling:
        """The request's values where it sets them, else ``defaults``, else the off value."""
        return cls(
            max_tokens=defaults.max_tokens if sampling.max_tokens is None else sampling.max_tokens,
            temperature=(
                defaults.temperature if sampling.temperature is None else sampling.temperature
            ),
            top_p=1.0 if sampling.top_p is None else sampling.top_p,
            top_k=0 if sampling.top_k is None else sampling.top_k,
            seed=_SEEDS.getrandbits(63) if sampling.seed is None else sampling.seed,
            seeded=sampling.seed is not None,
            stop=tuple(s for s in sampling.stop if s),
            presence_penalty=(
                0.0 if sampling.presence_penalty is None else sampling.presence_penalty
            ),
            frequency_penalty=(
                0.0 if sampling.frequency_penalty is None else sampling.frequency_penalty
            ),
            repetition_penalty=(
                1.0 if sampling.repetition_penalty is None else sampling.repetition_penalty
            ),
            enable_thinking=defaults.enable_thinking
            if enable_thinking is None
            else enable_thinking,
            n=1 if sampling.n is None else sampling.n,
            logprobs=bool(sampling.logprobs),
            top_logprobs=sampling.top_logprobs or 0,
            response_format=sampling.response_format,
        )

    @classmethod
    def prompt_only(cls) -> ResolvedSampling:
        """The settings of a request that generates nothing (an embeddings request): no
        token to generate, every option off. Asks for no field."""
        return cls(
            max_tokens=0,
            temperature=0.0,
            top_p=1.0,
            top_k=0,
            seed=0,
            seeded=False,
            stop=(),
            presence_penalty=0.0,
            frequency_penalty=0.0,
            repetition_penalty=1.0,
            enable_thinking=False,
        )

    def for_another(self) -> ResolvedSampling:
        """The same settings for another request that asked for the same: a seed the
        request did not fix is drawn anew, as :meth:`resolve` draws it (one draw per
        unseeded request, in order). Admission resolves each distinct request setting once
        and takes it from here (issue 42)."""
        if self.seeded:
            return self  # frozen: every field is the same, the seed included
        copy = object.__new__(ResolvedSampling)
        copy.__dict__.update(self.__dict__)  # what the frozen __init__ sets, field by field
        object.__setattr__(copy, "seed", _SEEDS.getrandbits(63))
        return copy

    def choice_seed(self, index: int) -> int:
        """The seed of choice ``index`` (``seed + index``, kept within 63 bits)."""
        return (self.seed + index) % 2**63

    @property
    def asks_for(self) -> frozenset[str]:
        """The request-body fields (:mod:`worker.wire.fields`) these settings use: each
        set to a value other than its off value. An engine must honour every one of them."""
        used = {
            "temperature": self.temperature != 0,
            "top_p": self.top_p != 1.0,
            "top_k": self.top_k != 0,
            "seed": self.seeded,
            "stop": bool(self.stop),
            "presence_penalty": self.presence_penalty != 0,
            "frequency_penalty": self.frequency_penalty != 0,
            "repetition_penalty": self.repetition_penalty != 1.0,
            "n": self.n != 1,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs != 0,
            "response_format": self.response_format.type != "text",
        }
        return frozenset(name for name, on in used.items() if on)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def deterministic(self) -> bool:
        """Greedy decoding or a fixed seed: identical inputs give identical outputs."""
        return self.greedy or self.seeded

    @property
    def penalized(self) -> bool:
        """Some penalty is on: the logits depend on the tokens seen so far."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class EngineInput:
    """A request ready to run: its tokens and resolved sampling settings.

    ``key`` is unique among the requests in flight in one worker. An embeddings request
    has one token sequence per input text in ``embedding_inputs``; its
    ``prompt_token_ids`` is their concatenation (what the batcher counts).
    """

    key: str
    prompt_token_ids: tuple[int, ...]
    sampling: ResolvedSampling
    embedding_inputs: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Completion:
    """What an engine made of one input: its first choice inline, the others (n > 1) in
    ``extra_choices``. ``completion_tokens`` counts the tokens of every choice; ``logprobs``
    is set (the first choice's) exactly when the input asked for them. An embedding
    engine answers ``embeddings``: one vector per ``EngineInput.embedding_inputs``."""

    key: str
    text: str = ""
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    error: ErrorInfo | None = None
    logprobs: Logprobs = None
    extra_choices: tuple[Choice, ...] = ()
    embeddings: Embeddings = ()

    @classmethod
    def failed(cls, key: str, code: ErrorCode, message: str, prompt_tokens: int) -> Completion:
        """A request that ran and failed: finish reason "error", ``code`` and ``message``."""
        return cls(
            key=key,
            finish_reason="error",
            prompt_tokens=prompt_tokens,
            error=ErrorInfo(int(code), message),
        )


class EngineOutOfMemory(BatchpipeError, RuntimeError):
    """The batch did not fit in the device's memory; split it and shrink the batch size."""


class EngineBroken(BatchpipeError, RuntimeError):
    """An in-flight engine cannot go on (its scheduler died, it was closed): every request
    in it is lost. Raised by ``submit`` and ``completions``."""

    code = ErrorCode.ENGINE_FAILED


OnComplete = Callable[[Completion], None]


FeedMode = Literal["static", "in_flight"]


@dataclass(frozen=True)
class Capacity:
    """How much more an in-flight engine takes now: sequences, and tokens counted as
    prompt + ``max_tokens`` of each sequence (what its KV cache must be able to hold).

    ``flex``: whether a flex-tier request (the feeder's tag at or above
    :data:`batcher.tiers.FLEX_TAG`) may start now. Only an engine that shares its server
    with traffic the worker cannot see closes it (the remote engine, while that server
    shows pressure: :mod:`worker.engines.remote.gate`); the worker then starts only the
    other tiers' requests, and the flex ones wait in its queue, not on the engine.
    """

    sequences: int
    tokens: int
    flex: bool = True


class Engine(ABC):
    """An inference engine serving one model; see the module docstring for the contract."""

    #: the model name requests address (``InferenceRequest.model``); "" also means it
    model_name: str
    #: how the worker feeds it: :class:`StaticEngine` or :class:`InFlightEngine`
    mode: ClassVar[FeedMode]
    #: the endpoints whose requests it serves; another endpoint's are refused at admission
    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({"chat", "completions", "responses"})
    #: the ``engine`` fields of :mod:`worker.wire.fields` it applies; a request that asks
    #: for another (``ResolvedSampling.asks_for``) is refused with 4002 at admission
    honours: ClassVar[frozenset[str]] = frozenset()
    #: fields that cannot change its answer (the echo engine has no distribution to shape):
    #: accepted, and documented as without effect
    inert: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def load(self) -> None:
        """Load the model. Raises :class:`~worker.errors.ModelLoadError` on failure."""

    @abstractmethod
    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        """The prompt's token ids, with the chat template applied to ``messages``.

        Raises :class:`~worker.errors.RequestError` (4002) for input the model cannot take.
        """

    def encode_inputs(self, request: InferenceRequest) -> tuple[tuple[int, ...], ...]:
        """The token ids of each input text of an embeddings request, for engines that
        serve ``/v1/embeddings`` (:mod:`worker.engines.embed.base`); 4002 otherwise."""
        raise RequestError(
            ErrorCode.INVALID_PARAMETER,
            f"the {type(self).__name__} engine does not serve /v1/embeddings",
            request.custom_id,
            param="url",
        )

    @abstractmethod
    def utilization(self) -> float:
        """Busy fraction of the device in [0, 1] since the previous call."""

    def close(self) -> None:  # noqa: B027 — optional hook, engines without resources skip it
        """Release the model and any device memory; aborts whatever is still running."""

    def collectors(self) -> Sequence[Collector]:
        """Prometheus collectors of the engine's own series, registered on the worker's
        registry once at start (the remote engine's server answers); none by default."""
        return ()


class StaticEngine(Engine):
    """Runs one batch at a time (hf, echo)."""

    mode: ClassVar[FeedMode] = "static"

    @abstractmethod
    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        """Run ``inputs`` together, calling ``on_complete`` once per input as it finishes."""


class InFlightEngine(Engine):
    """Takes requests at any time and batches them itself at every step (vllm, trtllm)."""

    mode: ClassVar[FeedMode] = "in_flight"

    @abstractmethod
    def submit(self, item: EngineInput) -> None:
        """Start ``item`` now, alongside whatever runs; never waits for generation.

        ``item.key`` is not in flight in this engine (the worker never reuses a key).
        """

    @abstractmethod
    def abort(self, keys: Collection[str]) -> None:
        """Stop these requests and free what they hold; none of them is completed later."""

    @abstractmethod
    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        """Requests finished since the previous call; waits up to ``timeout_s`` for the
        first one when there is none yet."""

    @abstractmethod
    def capacity(self) -> Capacity:
        """Room for more requests now, within the limits the engine was loaded with."""
