"""The one place that turns ``engine.kind`` into an engine.

Imports are lazy: the echo engine never imports torch, and vLLM and TensorRT-LLM are
imported only when their kind is chosen (and then only by ``load()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Engine
from worker.errors import ModelLoadError

if TYPE_CHECKING:
    from worker.engines.embed.base import EmbeddingEngine


def create_engine(engine: EngineConfig, batching: BatchingConfig) -> Engine:
    """An unloaded engine for ``engine.kind`` and ``engine.task``; the caller calls ``load()``."""
    if engine.task == "embed":
        return _embedding_class(engine.kind)(engine, batching)
    if engine.kind == "echo" and engine.echo_mode == "in_flight":
        from worker.engines.echo_inflight import EchoInFlightEngine

        return EchoInFlightEngine(
            delay_per_token_s=engine.simulated_token_s,
            delay_per_seq_token_s=engine.simulated_token_per_seq_s,
            max_sequences=batching.max_batch_size,
            max_tokens=batching.max_batch_tokens,
        )
    if engine.kind == "echo":
        from worker.engines.echo import EchoEngine

        return EchoEngine(
            delay_per_token_s=engine.simulated_token_s,
            delay_per_seq_token_s=engine.simulated_token_per_seq_s,
        )
    if engine.kind == "hf":
        from worker.engines.hf.engine import HFEngine

        return HFEngine(engine, batching)
    if engine.kind == "vllm":
        from worker.engines.vllm.engine import VllmEngine

        return VllmEngine(engine, batching)
    if engine.kind == "trtllm":
        from worker.engines.trtllm import TrtLlmEngine

        return TrtLlmEngine(engine, batching)
    raise ModelLoadError(f"unknown engine kind {engine.kind!r}: expected hf, vllm, trtllm or echo")


def engine_class(kind: str, task: str = "generate") -> type[Engine]:
    """The engine class of ``kind`` for ``task``, for what it declares (``honours``,
    ``inert``, ``endpoints``); imports its module, never its heavy libraries."""
    if task == "embed":
        return _embedding_class(kind)
    if kind == "echo":
        from worker.engines.echo import EchoEngine

        return EchoEngine
    if kind == "hf":
        from worker.engines.hf.engine import HFEngine

        return HFEngine
    if kind == "vllm":
        from worker.engines.vllm.engine import VllmEngine

        return VllmEngine
    if kind == "trtllm":
        from worker.engines.trtllm import TrtLlmEngine

        return TrtLlmEngine
    raise ModelLoadError(f"unknown engine kind {kind!r}")


def _embedding_class(kind: str) -> type[EmbeddingEngine]:
    if kind == "hf":
        from worker.engines.embed.hf import HFEmbedEngine

        return HFEmbedEngine
    if kind == "vllm":
        from worker.engines.embed.vllm import VllmEmbedEngine

        return VllmEmbedEngine
    raise ModelLoadError(f"engine.task embed needs engine.kind hf or vllm, not {kind!r}")
