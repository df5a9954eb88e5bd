"""The embedding engine contract: texts in, one vector per text out, static batches.

An :class:`EmbeddingEngine` serves ``/v1/embeddings`` requests only. At admission
:meth:`~EmbeddingEngine.encode_inputs` tokenizes each input text (a text longer than the
model takes is 4003 naming ``input``; a ``dimensions`` other than the model's own size is
4002 naming ``dimensions``: no served model can shorten its vectors). The worker batches
requests by their tokens like generation requests, with nothing to generate
(``max_tokens`` 0), and :meth:`~EmbeddingEngine.run_batch` embeds every text of the batch
in one call of :meth:`~EmbeddingEngine.embed`, then completes each request with its
vectors, in its inputs' order.

What is pooled, and how, is the model's own recipe (:mod:`worker.engines.embed.recipe`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from itertools import chain
from typing import Any, ClassVar

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Completion, EngineInput, OnComplete, StaticEngine
from worker.engines.embed.recipe import Recipe
from worker.engines.utilization import BusyMeter
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import Endpoint, InferenceRequest

Vector = tuple[float, ...]


class EmbeddingEngine(StaticEngine):
    """Embeds the texts of ``/v1/embeddings`` requests; see the module docstring.

    A subclass loads its model in :meth:`load` (setting :attr:`recipe` and
    :attr:`tokenizer`) and implements :meth:`embed`.
    """

    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({"embeddings"})

    def __init__(self, engine: EngineConfig, batching: BatchingConfig | None = None) -> None:
        self._config = engine
        self._batching = batching or BatchingConfig()
        self.model_name = engine.model
        self._meter = BusyMeter()
        self.recipe: Recipe | None = None
        self.tokenizer: Any = None

    @abstractmethod
    def embed(self, sequences: Sequence[tuple[int, ...]]) -> list[Vector]:
        """One vector per token sequence, in order (pooled and normalised as the model's
        recipe says). Raises for the whole call; the caller splits and retries."""

    def _loaded(self) -> tuple[Recipe, Any]:
        if self.recipe is None or self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.load() has not been called")
        return self.recipe, self.tokenizer

    def encode_inputs(self, request: InferenceRequest) -> tuple[tuple[int, ...], ...]:
        recipe, tokenizer = self._loaded()
        if request.dimensions is not None and request.dimensions != recipe.dimension:
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"dimensions {request.dimensions}: model {self.model_name!r} gives "
                f"{recipe.dimension}-dimensional vectors and cannot shorten them",
                request.custom_id,
                param="dimensions",
            )
        encoded = []
        for i, text in enumerate(request.embedding_inputs):
            ids = tuple(tokenizer(recipe.prepared(text), add_special_tokens=True)["input_ids"])
            if len(ids) > recipe.max_tokens:
                raise RequestError(
                    ErrorCode.OVER_LIMIT,
                    f"input[{i}] is {len(ids)} tokens; model {self.model_name!r} takes at "
                    f"most {recipe.max_tokens}",
                    request.custom_id,
                    param="input",
                )
            encoded.append(ids)
        return tuple(encoded)

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        """Every input's tokens, concatenated: what the request costs the batcher."""
        return tuple(chain.from_iterable(self.encode_inputs(request)))

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        with self._meter.busy():
            vectors = self.embed([ids for item in inputs for ids in item.embedding_inputs])
        if len(vectors) != sum(len(item.embedding_inputs) for item in inputs):
            raise RuntimeError(f"{type(self).__name__} returned {len(vectors)} vectors")
        at = 0
        for item in inputs:
            count = len(item.embedding_inputs)
            on_complete(
                Completion(
                    key=item.key,
                    prompt_tokens=len(item.prompt_token_ids),
                    embeddings=tuple(vectors[at : at + count]),
                )
            )
            at += count

    def utilization(self) -> float:
        return self._meter.fraction()
