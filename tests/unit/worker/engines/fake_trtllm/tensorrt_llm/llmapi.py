"""``tensorrt_llm.llmapi.KvCacheConfig`` (``tensorrt_llm/llmapi/llm_args.py``): the fields used."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True
