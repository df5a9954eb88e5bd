"""The engine contract. The worker drives every engine through this interface only.

Lifecycle: ``load()`` once (raises :class:`~worker.errors.ModelLoadError` → 5003, the
worker stays not ready), then any number of ``encode()`` and ``run_batch()`` calls,
then ``close()``.

Threading: ``encode()`` is called from the worker's main thread (decode/admit);
``run_batch()`` from one dedicated engine thread, never concurrently with itself.
``utilization()`` may be called from any thread.

Invariants every engine keeps (``tests/unit/test_engine_contract.py`` checks them):

* ``run_batch`` calls ``on_complete`` exactly once for every input, in any order,
  as soon as that input is finished, before it returns; a per-request failure is a
  :class:`Completion` with ``error`` set (code 5000), not an exception.
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

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker.errors import BatchpipeError
from worker.wire.messages import ErrorInfo, FinishReason, InferenceRequest, SamplingParams


@dataclass(frozen=True)
class EngineInput:
    """A request ready to run: its tokens and fully resolved sampling settings.

    ``key`` is unique among the requests in flight in one worker.
    ``sampling.max_tokens`` is always set.
    """

    key: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams


@dataclass(frozen=True)
class Completion:
    key: str
    text: str = ""
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    error: ErrorInfo | None = None


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
