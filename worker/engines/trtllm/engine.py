"""``TrtLlmEngine``: TensorRT-LLM's ``LLM`` fed in flight, one ``generate_async`` per request.

TensorRT-LLM's scheduler adds and retires sequences at every decoding step; the worker
submits a request whenever :meth:`TrtLlmEngine.capacity` has room and collects each
completion as it finishes. All calls into TensorRT-LLM run on one event loop that lives
as long as the engine (:class:`~worker.engines.trtllm.loop.LoopThread`), so every reply,
late abort acknowledgements included, arrives on a running loop.

API used, from the NVIDIA/TensorRT-LLM sources (1.2.x): ``tensorrt_llm/llmapi/llm.py``
(``LLM(model, dtype=..., **kwargs)`` with the ``TorchLlmArgs`` fields ``backend``,
``max_batch_size``, ``max_num_tokens``, ``kv_cache_config`` and ``load_format`` —
"auto" or "dummy"; ``generate_async(inputs, sampling_params=...)`` taking a list of token
ids; ``shutdown()``), ``tensorrt_llm/llmapi/llm_args.py`` (``KvCacheConfig``
``free_gpu_memory_fraction``, ``enable_block_reuse``), ``tensorrt_llm/executor/result.py``
(``GenerationResult.aresult()``, ``abort()``, ``finished``, ``outputs``) and
``tensorrt_llm/executor/utils.py`` (``RequestError``, a per-request failure; any other
exception out of a result means the executor shut itself down). ``guided_decoding_backend``
("xgrammar" or "llguidance") is a field of ``BaseLlmArgs`` in
``tensorrt_llm/llmapi/llm_args.py``; without it a request's ``guided_decoding`` has no
backend to enforce it.

A request with ``n`` choices runs as ``n`` TensorRT-LLM requests of one choice, choice
``i`` seeded ``seed + i`` as on every engine here (TensorRT-LLM's own ``n`` refuses greedy
decoding and draws every choice from one seed; :mod:`~worker.engines.trtllm.mapping`).

What 1.2.1 does not do, and what the engine does about it: ``TorchSampler``
(``tensorrt_llm/_torch/pyexecutor/sampler.py``, the default ``sampler_type`` "auto" of
``TorchLlmArgs`` in ``llm_args.py``) applies no penalty and seeds one generator 42 for
every request, so ``seed`` and the three penalties are refused (4002 naming the field)
rather than silently ignored; the grammar matcher compiles every schema strictly, so
``strict: false`` is refused; ``LLM.shutdown()`` aborts pending results through the
request queue (``executor/proxy.py``, ``pre_shutdown``), so it runs on the loop's thread,
the one thread that writes to that queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from worker.engines.base import MODEL_ENGINE_FIELDS, Capacity, Completion, EngineInput
from worker.engines.library import LibraryEngine
from worker.engines.models import locate_model
from worker.engines.trtllm.loop import LoopThread
from worker.engines.trtllm.mapping import (
    completion,
    failed,
    guide_kwargs,
    rejected,
    sampling_kwargs,
)
from worker.engines.utilization import gpu_counter
from worker.errors import BatchpipeError, ErrorCode, ModelLoadError
from worker.wire.messages import ResponseFormat

#: how long close() waits for TensorRT-LLM's shutdown on the loop's thread
SHUTDOWN_TIMEOUT_S = 120.0


class TrtLlmFailed(BatchpipeError, RuntimeError):
    """TensorRT-LLM itself failed (its executor shut down); no request can run any more."""


@dataclass
class _Run:
    """One submitted request; ``handles`` are TensorRT-LLM's results (one per choice)
    once it has accepted it."""

    item: EngineInput
    handles: list[Any] = field(default_factory=list)
    aborted: bool = False  # read and written on the loop's thread only

    @property
    def sequences(self) -> int:
        return self.item.sampling.n

    @property
    def tokens(self) -> int:  # what its KV cache must be able to hold
        return (len(self.item.prompt_token_ids) + self.item.sampling.max_tokens) * self.sequences


class TrtLlmEngine(LibraryEngine):
    """``tensorrt_llm.LLM`` serving a local Hugging Face checkpoint directory."""

    kind = "trtllm"
    # TorchSampler of 1.2.x ignores these silently (see the module docstring): refused
    honours = MODEL_ENGINE_FIELDS - {
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    }

    def _init_state(self) -> None:
        self._llm: Any = None
        self._sampling_params: Any = None
        self._guided_decoding: Any = None
        self._request_error: type[Exception] = RuntimeError
        self._stop_token_ids: tuple[int, ...] = ()  # the model's EOS ids beside end_id
        self._loop: LoopThread | None = None
        self._gpu_counter: Callable[[], float] | None = None
        self._busy = contextlib.ExitStack()  # open while any request is in flight
        # guards _running, _reserved, _sequences, _busy, _unread, _dropped
        self._lock = threading.Lock()
        self._running: dict[str, _Run] = {}
        # finished but not handed out yet; an abort that comes in between drops the answer
        self._unread: set[str] = set()
        self._dropped: set[str] = set()
        self._reserved = 0
        self._sequences = 0  # n of every request in _running
        # finished requests, and None once TensorRT-LLM has failed (wakes a waiting reader)
        self._done: queue.Queue[Completion | None] = queue.Queue()
        self._failure: BaseException | None = None

    def load(self) -> None:
        try:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.executor import RequestError
            from tensorrt_llm.llmapi import KvCacheConfig
            from tensorrt_llm.sampling_params import GuidedDecodingParams
        except ImportError as exc:
            raise ModelLoadError(
                "the trtllm engine needs TensorRT-LLM, which needs an NVIDIA GPU "
                f"(pip install 'batchpipe[trtllm]'): tensorrt_llm is not importable: {exc}"
            ) from exc
        from worker.engines.hf.model import ChatEncoder, load_tokenizer, model_eos_ids

        source = locate_model(self._config.model)
        if source.gguf_file:
            raise ModelLoadError(
                f"TensorRT-LLM loads Hugging Face checkpoints, not GGUF ({source}): "
                "set engine.model to a local model directory"
            )
        tokenizer = load_tokenizer(source)
        eos = model_eos_ids(str(source.directory), tokenizer)
        self._stop_token_ids = tuple(sorted(eos - {tokenizer.eos_token_id}))
        try:
            self._llm = LLM(
                model=str(source.directory),
                backend="pytorch",
                dtype=self._config.dtype,
                max_batch_size=self._batching.max_batch_size,
                max_num_tokens=self._batching.max_batch_tokens,
                load_format=self._config.load_format,
                # response_format: xgrammar, the backend encode() checks schemas against
                guided_decoding_backend="xgrammar",
                kv_cache_config=KvCacheConfig(
                    free_gpu_memory_fraction=self._config.gpu_memory_fraction,
                    # batching.shared_prefix: prompts with a common prefix reuse its KV blocks
                    enable_block_reuse=self._batching.shared_prefix,
                ),
            )
        except Exception as exc:
            raise ModelLoadError(f"TensorRT-LLM cannot load {source}: {exc}") from exc
        self._sampling_params = SamplingParams
        self._guided_decoding = GuidedDecodingParams
        self._request_error = RequestError
        self._encoder = ChatEncoder(tokenizer, len(tokenizer))
        self._loop = LoopThread("trtllm-loop")
        self._gpu_counter = gpu_counter()

    def submit(self, item: EngineInput) -> None:
        loop = self._loaded()
        self._raise_if_failed()
        run = _Run(item)
        with self._lock:
            self._running[item.key] = run
            self._reserved += run.tokens
            self._sequences += run.sequences
            if len(self._running) == 1:
                self._busy.enter_context(self._meter.busy())
        loop.spawn(self._serve(run))

    def abort(self, keys: Collection[str]) -> None:
        loop = self._loaded()
        with self._lock:
            runs = [self._running[key] for key in keys if key in self._running]
            for run in runs:
                self._forget(run)
            self._dropped.update(key for key in keys if key in self._unread)
        for run in runs:
            loop.call(self._abort_on_loop, run)

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        self._loaded()
        found: list[Completion | None] = []
        with contextlib.suppress(queue.Empty):
            found.append(
                self._done.get(timeout=timeout_s) if timeout_s > 0 else self._done.get_nowait()
            )
            while True:
                found.append(self._done.get_nowait())
        with self._lock:
            done = [c for c in found if c is not None and self._hand_out(c.key)]
        if None in found:
            self._done.put(None)  # the failure is for good: wake every later reader too
        if not done:  # what finished before a failure is still handed out first
            self._raise_if_failed()
        return done

    def capacity(self) -> Capacity:
        with self._lock:
            return Capacity(
                sequences=max(0, self._batching.max_batch_size - self._sequences),
                tokens=max(0, self._batching.max_batch_tokens - self._reserved),
            )

    def utilization(self) -> float:
        busy = self._meter.fraction()
        return self._gpu_counter() if self._gpu_counter is not None else busy

    def close(self) -> None:
        loop, llm = self._loop, self._llm
        if loop is not None:
            with self._lock:
                keys = list(self._running)
            self.abort(keys)
            if llm is not None:
                # after the aborts, on the loop's thread: shutdown aborts what is still
                # pending through the request queue, which only that thread writes to
                loop.call_and_wait(llm.shutdown, timeout_s=SHUTDOWN_TIMEOUT_S)
            loop.stop(timeout_s=10.0)
        elif llm is not None:
            llm.shutdown()
        self._llm = self._loop = None

    def format_problem(self, fmt: ResponseFormat) -> str | None:
        if fmt.type == "json_schema" and not fmt.strict_mode:
            # grammar_matcher.py compiles every schema in xgrammar's strict mode
            return (
                "strict: false is not supported by TensorRT-LLM, which compiles every "
                "schema strictly (no members beyond those listed); send strict: true"
            )
        return super().format_problem(fmt)

    # -- on the loop's thread --------------------------------------------------------

    async def _serve(self, run: _Run) -> None:
        if run.aborted:
            return
        item = run.item
        try:
            for i in range(item.sampling.n):
                # on the loop's thread: the result binds its reply queue to this running loop
                run.handles.append(
                    self._llm.generate_async(
                        list(item.prompt_token_ids), sampling_params=self._params(item, i)
                    )
                )
        except (ValueError, self._request_error) as exc:
            self._abort_on_loop(run)  # the choices it took already
            self._finish(run, rejected(item, exc))
            return
        except Exception as exc:
            self._fail(exc)
            return
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(handle.aresult() for handle in run.handles)),
                self._config.engine_timeout_s,
            )
        except asyncio.TimeoutError:
            self._abort_on_loop(run)
            timeout = self._config.engine_timeout_s
            self._finish(
                run,
                failed(
                    item, ErrorCode.ENGINE_FAILED, f"no result within engine_timeout_s={timeout}"
                ),
            )
        except self._request_error as exc:
            self._abort_on_loop(run)  # its other choices
            self._finish(run, rejected(item, exc))
        except Exception as exc:
            self._fail(exc)
        else:
            outputs = [result.outputs[0] for result in results]
            try:
                done = completion(item, outputs, self._encoder.decode)
            except Exception as exc:  # one answer that cannot be read fails alone
                done = failed(
                    item, ErrorCode.ENGINE_FAILED, f"TensorRT-LLM's answer is unusable: {exc}"
                )
            self._finish(run, done)

    def _params(self, item: EngineInput, choice: int) -> Any:
        """``SamplingParams`` of choice ``choice`` of ``item`` (seeded ``seed + choice``)."""
        s = item.sampling
        guide = guide_kwargs(s.response_format)
        return self._sampling_params(
            **{
                **sampling_kwargs(
                    s, ignore_eos=self._ignore_eos, stop_token_ids=self._stop_token_ids
                ),
                "seed": s.choice_seed(choice),
                "guided_decoding": None if guide is None else self._guided_decoding(**guide),
            }
        )

    def _abort_on_loop(self, run: _Run) -> None:
        run.aborted = True
        for handle in run.handles:
            if not handle.finished:
                handle.abort()

    def _finish(self, run: _Run, done: Completion) -> None:
        with self._lock:
            if self._running.get(run.item.key) is not run:
                return  # aborted: never completed
            self._forget(run)
            self._unread.add(run.item.key)
        self._done.put(done)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._done.put(None)

    # -- helpers ---------------------------------------------------------------------

    def _hand_out(self, key: str) -> bool:  # under self._lock
        """``key`` finished: hand it out unless it was aborted after it finished."""
        self._unread.discard(key)
        if key in self._dropped:
            self._dropped.discard(key)
            return False
        return True

    def _forget(self, run: _Run) -> None:  # under self._lock
        del self._running[run.item.key]
        self._reserved -= run.tokens
        self._sequences -= run.sequences
        if not self._running:
            self._busy.close()

    def _loaded(self) -> LoopThread:
        if self._loop is None:
            raise RuntimeError("TrtLlmEngine.load() has not been called")
        return self._loop

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise TrtLlmFailed(f"TensorRT-LLM failed: {self._failure}") from self._failure
