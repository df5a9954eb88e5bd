"""What the engines over an inference library (vllm, trtllm) share.

:class:`LibraryEngine` is their common ground: configured from ``engine`` and ``batching``,
prompts tokenized by the worker's own :class:`~worker.engines.hf.model.ChatEncoder` (the
library gets token ids), a ``response_format`` checked at admission so a schema the
library's grammar backend (xgrammar, in both) cannot take is a 4002 there, never a failure
in flight, and every field of :data:`~worker.engines.base.MODEL_ENGINE_FIELDS` honoured.

:func:`token_logprobs` turns the per-token log probabilities both libraries report (one
``{token id: Logprob}`` dict per generated token, ``Logprob.logprob`` the value) into the
entries of an answer, with the token texts decoded as the hf engine decodes them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from worker.config import BatchingConfig, EngineConfig, EngineKind
from worker.engines.base import MODEL_ENGINE_FIELDS, InFlightEngine
from worker.engines.utilization import BusyMeter
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import InferenceRequest, ResponseFormat, TokenLogprob


class LibraryEngine(InFlightEngine):
    """An in-flight engine over an inference library; ``ignore_eos`` makes every request
    generate exactly ``max_tokens`` tokens (benchmarks)."""

    honours = MODEL_ENGINE_FIELDS
    #: ``engine.kind`` of the default configuration
    kind: ClassVar[EngineKind]

    def __init__(
        self,
        engine: EngineConfig | None = None,
        batching: BatchingConfig | None = None,
        *,
        ignore_eos: bool = False,
    ) -> None:
        self._config = engine or EngineConfig(kind=self.kind)
        self._batching = batching or BatchingConfig()
        self._ignore_eos = ignore_eos
        self.model_name = self._config.model
        self._meter = BusyMeter()
        self._encoder: Any = None  # a ChatEncoder once loaded
        self._init_state()

    @abstractmethod
    def _init_state(self) -> None:
        """Set the engine's own attributes (called last by ``__init__``)."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        if self._encoder is None:
            raise RuntimeError(f"{type(self).__name__}.load() has not been called")
        ids: tuple[int, ...] = self._encoder.encode(request)
        fmt = request.sampling.response_format
        if fmt.type != "text":
            problem = self.format_problem(fmt)
            if problem is not None:
                raise RequestError(
                    ErrorCode.INVALID_PARAMETER,
                    f"response_format: the schema cannot be compiled into a grammar: {problem}",
                    request.custom_id,
                    param="response_format",
                )
        return ids

    def format_problem(self, fmt: ResponseFormat) -> str | None:
        """Why ``fmt`` cannot be compiled, None when it can. This default asks xgrammar
        (the grammar backend both libraries use here) to build the schema's grammar."""
        import xgrammar as xgr  # with the first structured request, not before

        try:
            xgr.Grammar.from_json_schema(fmt.constraint, strict_mode=fmt.strict_mode)
        except Exception as exc:  # xgrammar raises RuntimeError or ValueError with its reason
            return str(exc)
        return None

    def token_logprobs(
        self, token_ids: Sequence[int], entries: Sequence[Mapping[int, Any]], top: int
    ) -> tuple[TokenLogprob, ...]:
        """:func:`token_logprobs` with this engine's decoder."""
        return token_logprobs(token_ids, entries, top, lambda t: self._encoder.decode([t]))


def token_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[Mapping[int, Any]],
    top: int,
    decode: Callable[[int], str],
) -> tuple[TokenLogprob, ...]:
    """One entry per generated token (``entries[i]`` holds ``token_ids[i]`` and the
    likeliest tokens there), each with its ``top`` likeliest alternatives, likeliest first.

    A library reports the chosen token's value even when it is not among the likeliest, so
    the alternatives are the ``top`` highest values of the dict, not all of it.
    """
    out = []
    for token, entry in zip(token_ids, entries, strict=False):
        ranked = sorted(entry.items(), key=lambda item: -float(item[1].logprob))[:top]
        alternatives = tuple(TokenLogprob(decode(t), float(p.logprob)) for t, p in ranked)
        out.append(TokenLogprob(decode(token), float(entry[token].logprob), alternatives))
    return tuple(out)
