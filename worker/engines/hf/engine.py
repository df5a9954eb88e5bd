"""The transformers engine: static batches through ``generate``, on the CPU or CUDA.

One ``generate`` call per batch: prompts left-padded with an attention mask (transformers
derives position ids from the mask, so padding does not shift a row's positions), and
per-row sampling and stopping (:mod:`worker.engines.hf.sampling`) so requests with
different settings share the batch. Each request completes as soon as its row ends.

With ``batching.shared_prefix``, a prompt prefix (whole 32-token blocks) that several rows
of a batch share is computed once and kept in a small LRU, and those rows run from its KV
cache (:mod:`worker.engines.hf.prefix_cache`). A batch with a ``repetition_penalty`` row runs
in full: the penalty reads each prompt as one contiguous left-padded span, which the prefix
layout (pads between the cached region and the rest) is not. A row with a
``response_format`` is guided by its xgrammar grammar (:mod:`worker.engines.hf.grammar`).

Token ids are laid out in the reusable buffers of
:class:`~worker.engines.hf.pinned.PinnedBufferPool`; on CUDA those are pinned (when
``engine.pinned_memory``) and copied on a side stream. A CUDA out-of-memory error before
any request completed becomes :class:`~worker.engines.base.EngineOutOfMemory`, so the
caller splits the batch and shrinks its batch size; a failure after some requests
completed re-runs the rest one at a time, and a request that still fails completes with
error 5000. Utilization is the GPU's own (NVML, via ``torch.cuda.utilization``) when
readable, else the engine's busy fraction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList
from transformers import GenerationConfig as HFGenerationConfig

from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import (
    MODEL_ENGINE_FIELDS,
    Completion,
    EngineInput,
    EngineOutOfMemory,
    OnComplete,
    ResolvedSampling,
    StaticEngine,
)
from worker.engines.choices import expand
from worker.engines.hf.grammar import GrammarMask, Grammars
from worker.engines.hf.logprobs import LogprobRecorder
from worker.engines.hf.model import (
    ChatEncoder,
    configure_cpu_threads,
    eos_token_ids,
    load_pretrained,
    prepare_model,
    resolve_device,
    resolve_dtype,
)
from worker.engines.hf.pinned import PinnedBufferPool
from worker.engines.hf.prefix_cache import PrefixCache
from worker.engines.hf.sampling import RowSampler, RowTracker, plain_greedy
from worker.engines.models import locate_model
from worker.engines.utilization import BusyMeter, gpu_counter
from worker.errors import ErrorCode, ModelLoadError
from worker.wire.messages import InferenceRequest


class HFEngine(StaticEngine):
    """transformers ``generate`` on static batches.

    ``preloaded`` (model, tokenizer) serves an in-memory model instead of loading
    ``engine.model`` (tests, benchmarks with random weights). ``ignore_eos`` makes every
    request generate exactly ``max_tokens`` tokens (benchmarks). A request with ``n``
    choices runs as ``n`` rows of the batch (:mod:`worker.engines.choices`).
    """

    honours = MODEL_ENGINE_FIELDS

    def __init__(
        self,
        engine: EngineConfig | None = None,
        batching: BatchingConfig | None = None,
        *,
        ignore_eos: bool = False,
        preloaded: tuple[Any, Any] | None = None,
    ) -> None:
        self._config = engine or EngineConfig(kind="hf")
        self._batching = batching or BatchingConfig()
        self._ignore_eos = ignore_eos
        self._preloaded = preloaded
        self.model_name = self._config.model
        self._meter = BusyMeter()
        self._model: Any = None
        self._encoder: ChatEncoder | None = None
        self._pool: PinnedBufferPool | None = None
        self._prefixes: PrefixCache | None = None
        self._eos: frozenset[int] = frozenset()
        self._pad = 0
        self._gpu_counter: Callable[[], float] | None = None
        self._grammars: Grammars | None = None
        self._grammars_lock = threading.Lock()
        self.device = torch.device("cpu")

    def load(self) -> None:
        self.device = resolve_device(self._config.device)
        dtype = resolve_dtype(self._config.dtype, self.device)
        if self.device.type == "cpu":
            configure_cpu_threads()
        try:
            if self._preloaded is not None:
                model, tokenizer = self._preloaded
                model = prepare_model(model.to(dtype), tokenizer, self.device)
            else:
                model, tokenizer = load_pretrained(
                    locate_model(self._config.model), self.device, dtype
                )
            vocab = int(model.get_input_embeddings().num_embeddings)
        except ModelLoadError:
            raise
        except Exception as exc:  # moving to the device, an unexpected architecture
            raise ModelLoadError(f"cannot load model {self._config.model!r}: {exc}") from exc
        self._model = model
        self._encoder = ChatEncoder(tokenizer, vocab)
        self._eos = eos_token_ids(model.generation_config.eos_token_id, tokenizer)
        self._pad = int(tokenizer.pad_token_id)
        self._pool = PinnedBufferPool(
            self.device, self._batching.max_batch_tokens, pin=self._config.pinned_memory
        )
        self._gpu_counter = gpu_counter(self.device) if self.device.type == "cuda" else None
        self._prefixes = PrefixCache(model) if self._batching.shared_prefix else None

    @property
    def encoder(self) -> ChatEncoder:
        if self._encoder is None:
            raise RuntimeError("HFEngine.load() has not been called")
        return self._encoder

    @property
    def model(self) -> Any:
        """The loaded transformers model (None before ``load()``)."""
        return self._model

    @property
    def pool(self) -> PinnedBufferPool | None:
        return self._pool

    @property
    def prefixes(self) -> PrefixCache | None:
        """The shared-prefix KV cache; None when ``batching.shared_prefix`` is off."""
        return self._prefixes

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        ids = self.encoder.encode(request)
        fmt = request.sampling.response_format
        if fmt.type != "text":  # compiled now, so a schema xgrammar refuses is a 4002 here
            self.grammars.compile(fmt, request.custom_id)
        return ids

    @property
    def grammars(self) -> Grammars:
        """The response-format compiler, made with the first structured request."""
        with self._grammars_lock:
            if self._grammars is None:
                vocab = int(self.model.get_input_embeddings().num_embeddings)
                self._grammars = Grammars(self.encoder.tokenizer, vocab, self._eos)
            return self._grammars

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        answered: set[str] = set()

        def complete(completion: Completion) -> None:
            answered.add(completion.key)
            on_complete(completion)

        with self._meter.busy():
            try:
                self._generate(inputs, complete)
            except Exception as exc:
                if not answered:
                    if isinstance(exc, torch.cuda.OutOfMemoryError):
                        torch.cuda.empty_cache()
                        raise EngineOutOfMemory(str(exc)) from exc
                    raise
                # part of the batch is answered already: the rest must be too, one by one
                for item in inputs:
                    if item.key not in answered:
                        self._run_alone(item, complete, answered)

    def _run_alone(self, item: EngineInput, complete: OnComplete, answered: set[str]) -> None:
        try:
            self._generate([item], complete)
        except Exception as exc:
            if item.key not in answered:
                complete(
                    Completion.failed(
                        item.key,
                        ErrorCode.ENGINE_FAILED,
                        f"engine failed: {exc}",
                        len(item.prompt_token_ids),
                    )
                )

    def _generate(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        if self._pool is None or self._model is None:
            raise RuntimeError("HFEngine.load() has not been called")
        rows_of_inputs, complete = expand(inputs, on_complete)  # n choices: n rows
        live: list[EngineInput] = []
        for item in rows_of_inputs:
            if item.sampling.max_tokens > 0:
                live.append(item)
            else:
                complete(
                    Completion(
                        key=item.key,
                        finish_reason="length",
                        prompt_tokens=len(item.prompt_token_ids),
                    )
                )
        if not live:
            return
        rows = [item.sampling for item in live]
        prompts = [item.prompt_token_ids for item in live]
        input_ids, attention_mask, cache = self._layout(self._pool, prompts, rows)
        padded = input_ids.shape[1]
        processors = LogitsProcessorList()
        recorder = None
        if any(row.logprobs for row in rows):
            # first: it reads the model's own logits, before any row's penalties or sampling
            recorder = LogprobRecorder(rows, lambda token: self.encoder.decode([token]))
            processors.append(recorder)
        tracker = RowTracker(live, padded, self._eos, self.encoder.decode, complete, recorder)
        if any(row.response_format.type != "text" for row in rows):
            # before RowSampler: a sampled row draws among the tokens its grammar allows
            grammars = self.grammars
            compiled = [
                None
                if row.response_format.type == "text"
                else grammars.compile(row.response_format)
                for row in rows
            ]
            processors.append(GrammarMask(compiled, tracker.finished, grammars.vocab_size))
        if not all(plain_greedy(row) for row in rows):
            processors.append(RowSampler(rows, [len(p) for p in prompts], padded))
        max_new = max(row.max_tokens for row in rows)
        config = HFGenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max_new,
            min_new_tokens=max_new if self._ignore_eos else None,
            do_sample=False,
            num_beams=1,
            eos_token_id=sorted(self._eos),
            pad_token_id=self._pad,
            bos_token_id=self._model.generation_config.bos_token_id,
        )
        with torch.inference_mode():
            sequences = self._model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([tracker]),
            )
        tracker.finish_rest(sequences)

    def _layout(
        self,
        pool: PinnedBufferPool,
        prompts: Sequence[tuple[int, ...]],
        rows: Sequence[ResolvedSampling],
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache | None]:
        """Input ids, attention mask and starting KV cache of one ``generate`` call.

        Without a shared prefix: every prompt left-padded, no cache. With one: see
        :class:`~worker.engines.hf.prefix_cache.PrefixCache` ``inputs``.
        """
        prefixes = self._prefixes
        plan = None
        if prefixes is not None and all(row.repetition_penalty == 1.0 for row in rows):
            plan = prefixes.plan(prompts)
        if prefixes is None or plan is None:
            staged = pool.stage(prompts, self._pad)
            return staged.input_ids, staged.attention_mask, None

        def stage(part: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            staged = pool.stage(part, self._pad)
            return staged.input_ids, staged.attention_mask

        return prefixes.inputs(plan, prompts, stage, self._pad)

    def utilization(self) -> float:
        busy = self._meter.fraction()
        return self._gpu_counter() if self._gpu_counter is not None else busy

    def close(self) -> None:
        self._model = None
        self._grammars = None
        self._encoder = None
        self._pool = None
        if self._prefixes is not None:
            self._prefixes.clear()
            self._prefixes = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
