"""The TensorRT-LLM engine, for NVIDIA GPUs: ``tensorrt_llm.LLM`` with in-flight batching.

Each input of a batch becomes one ``LLM.generate_async`` request; TensorRT-LLM batches
them in flight with everything else it is running and stages inputs in pinned memory
itself, so batchpipe's batcher acts as admission control and backpressure in front of it.
Results are gathered on an asyncio loop owned by the engine thread, and each request's
``on_complete`` fires as soon as its result arrives.

What was verified, and how: this module is written against the TensorRT-LLM 1.x LLM API
(PyTorch backend, the default from 1.0; the project pins ``tensorrt-llm>=1.2,<1.3``) as
read from the NVIDIA/TensorRT-LLM sources — ``tensorrt_llm/llmapi/llm.py`` (``LLM``,
``generate_async``), ``tensorrt_llm/sampling_params.py`` (``SamplingParams``: stop strings
are tokenized by ``_setup`` only when ``end_id`` is left unset; greedy is ``top_k=1``;
``top_k=0`` and ``top_p=1`` leave all tokens in; the penalties' neutral values are
repetition 1, presence 0 and frequency 0),
``tensorrt_llm/executor/result.py`` (``aresult()``, ``CompletionOutput.finish_reason`` /
``token_ids``, whose END_ID token is kept and whose stop-word tokens are trimmed) and
``tensorrt_llm/llmapi/llm_args.py`` (``KvCacheConfig``). It has NOT been executed: this
repository's CI has no NVIDIA GPU, and its tests skip with the reason
"tensorrt_llm not installed (needs an NVIDIA GPU); not run on this machine".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Completion, EngineInput, OnComplete, StaticEngine
from worker.engines.models import locate_model
from worker.engines.utilization import BusyMeter, gpu_counter
from worker.errors import ErrorCode, ModelLoadError
from worker.wire.messages import InferenceRequest


class TrtLlmEngine(StaticEngine):
    """``tensorrt_llm.LLM`` serving a local Hugging Face checkpoint directory."""

    # what _params maps onto tensorrt_llm.SamplingParams; n, logprobs and response_format
    # are not mapped, so requests asking for them are refused at admission
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
        self._config = engine or EngineConfig(kind="trtllm")
        self._batching = batching or BatchingConfig()
        self._ignore_eos = ignore_eos
        self.model_name = self._config.model
        self._meter = BusyMeter()
        self._llm: Any = None
        self._sampling_params: Any = None
        self._encoder: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gpu_counter: Callable[[], float] | None = None

    def load(self) -> None:
        try:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.llmapi import KvCacheConfig
        except ImportError as exc:
            raise ModelLoadError(
                "the trtllm engine needs TensorRT-LLM, which needs an NVIDIA GPU "
                f"(pip install 'batchpipe[trtllm]'): tensorrt_llm is not importable: {exc}"
            ) from exc
        from worker.engines.hf.model import ChatEncoder, load_tokenizer

        source = locate_model(self._config.model)
        if source.gguf_file:
            raise ModelLoadError(
                f"TensorRT-LLM loads Hugging Face checkpoints, not GGUF ({source}): "
                "set engine.model to a local model directory"
            )
        tokenizer = load_tokenizer(source)
        try:
            self._llm = LLM(
                model=str(source.directory),
                backend="pytorch",
                dtype=self._config.dtype,
                max_batch_size=self._batching.max_batch_size,
                max_num_tokens=self._batching.max_batch_tokens,
                kv_cache_config=KvCacheConfig(
                    free_gpu_memory_fraction=self._config.gpu_memory_fraction,
                    # batching.shared_prefix: prompts with a common prefix reuse its KV blocks
                    enable_block_reuse=self._batching.shared_prefix,
                ),
            )
        except Exception as exc:
            raise ModelLoadError(f"TensorRT-LLM cannot load {source}: {exc}") from exc
        self._sampling_params = SamplingParams
        self._encoder = ChatEncoder(tokenizer, len(tokenizer))
        self._loop = asyncio.new_event_loop()
        self._gpu_counter = gpu_counter()

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        if self._encoder is None:
            raise RuntimeError("TrtLlmEngine.load() has not been called")
        ids: tuple[int, ...] = self._encoder.encode(request)
        return ids

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        if self._loop is None:
            raise RuntimeError("TrtLlmEngine.load() has not been called")
        with self._meter.busy():
            self._loop.run_until_complete(self._run(inputs, on_complete))

    async def _run(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        # generate_async must be called with this loop running: the result object picks
        # its async queue when it is created
        submitted: list[tuple[EngineInput, Any]] = []
        rejected: list[Completion] = []
        try:
            for item in inputs:
                try:
                    future = self._llm.generate_async(
                        list(item.prompt_token_ids), sampling_params=self._params(item)
                    )
                except ValueError as exc:  # this request is over a limit of the engine
                    rejected.append(_failed(item, f"rejected by TensorRT-LLM: {exc}"))
                else:
                    submitted.append((item, future))
        except Exception:
            for _, future in submitted:  # the engine itself failed: nothing was completed
                future.abort()
            raise
        for completion in rejected:
            on_complete(completion)
        tasks = [asyncio.ensure_future(self._result(item, future)) for item, future in submitted]
        for finished in asyncio.as_completed(tasks):
            on_complete(await finished)

    def _params(self, item: EngineInput) -> Any:
        s = item.sampling
        # end_id stays unset: SamplingParams._setup then takes it from the tokenizer and
        # tokenizes the stop strings (an explicit end_id would skip both)
        return self._sampling_params(
            max_tokens=s.max_tokens,
            temperature=None if s.greedy else s.temperature,
            top_k=1 if s.greedy else s.top_k,
            top_p=None if s.greedy else s.top_p,
            seed=s.seed,
            stop=list(s.stop) or None,
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            ignore_eos=self._ignore_eos,
        )

    async def _result(self, item: EngineInput, future: Any) -> Completion:
        try:
            result = await asyncio.wait_for(future.aresult(), self._config.engine_timeout_s)
        except asyncio.TimeoutError:
            future.abort()
            return _failed(
                item, f"no result within engine_timeout_s={self._config.engine_timeout_s}"
            )
        except Exception as exc:
            return _failed(item, f"TensorRT-LLM failed: {exc}")
        output = result.outputs[0]
        if output.finish_reason not in ("stop", "length"):
            return _failed(item, f"TensorRT-LLM ended the request: {output.finish_reason}")
        return Completion(
            key=item.key,
            text=output.text,
            finish_reason=output.finish_reason,
            prompt_tokens=len(item.prompt_token_ids),
            completion_tokens=len(output.token_ids),
        )

    def utilization(self) -> float:
        busy = self._meter.fraction()
        return self._gpu_counter() if self._gpu_counter is not None else busy

    def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def _failed(item: EngineInput, message: str) -> Completion:
    return Completion.failed(item.key, ErrorCode.ENGINE_FAILED, message, len(item.prompt_token_ids))
