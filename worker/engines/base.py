"""The engine contract. The worker drives every engine through this interface only.

Lifecycle: ``load()`` once (raises :class:`~worker.errors.ModelLoadError` → 5003, the
worker stays not ready), then any number of ``encode()`` and ``run_batch()`` calls,
then ``close()``.

Threading: ``encode()`` is called from the worker's main thread (decode/admit);
``run_batch()`` from one dedicated engine thread, never concurrently with itself.
``utilization()`` may be called from any thread.

Invariants every engine keeps (``tests/unit/worker/engines/test_contract.py`` checks them):

* ``run_batch`` calls ``on_complete`` exactly once for every input, in any order,
  as soon as that input is finished, before it returns; a per-request failure is a
  :class:`Completion` with ``error`` set (:meth:`Completion.failed`, code 5000), not an
  exception.
* An exception out of ``run_batch`` means the whole batch failed (for example out of
  memory): nothing of it was completed, and the caller may split and retry it.
  :class:`EngineOutOfMemory` tells the caller to shrink its batches too.
* Greedy decoding (``temperature == 0``) gives the same text for a request whether it
  runs alone or in a batch.
* ``Completion.prompt_tokens == len(EngineInput.prompt_token_ids)``, and
  ``completion_tokens`` counts generated tokens up to and including the stop token,
  never padding.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker.config import GenerationConfig
from worker.errors import BatchpipeError, ErrorCode
from worker.wire.messages import ErrorInfo, FinishReason, InferenceRequest, SamplingParams


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
            seed=secrets.randbits(63) if sampling.seed is None else sampling.seed,
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
        )

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

    ``key`` is unique among the requests in flight in one worker.
    """

    key: str
    prompt_token_ids: tuple[int, ...]
    sampling: ResolvedSampling


@dataclass(frozen=True)
class Completion:
    key: str
    text: str = ""
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    error: ErrorInfo | None = None

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


OnComplete = Callable[[Completion], None]


class Engine(ABC):
    """An inference engine serving one model."""

    #: the model name requests address (``InferenceRequest.model``); "" also means it
    model_name: str

    @abstractmethod
    def load(self) -> None:
        """Load the model. Raises :class:`~worker.errors.ModelLoadError` on failure."""

    @abstractmethod
    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        """The prompt's token ids, with the chat template applied to ``messages``.

        Raises :class:`~worker.errors.RequestError` (4002) for input the model cannot take.
        """

    @abstractmethod
    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        """Run ``inputs`` together, calling ``on_complete`` once per input as it finishes."""

    @abstractmethod
    def utilization(self) -> float:
        """Busy fraction of the device in [0, 1] since the previous call."""

    def close(self) -> None:  # noqa: B027 — optional hook, engines without resources skip it
        """Release the model and any device memory."""
