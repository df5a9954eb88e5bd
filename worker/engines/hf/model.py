"""Loading a transformers causal LM offline, and turning requests into its token ids.

Shared by the hf engine and the trtllm engine (which tokenizes with the same Hugging Face
tokenizer before handing token ids to TensorRT-LLM).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.utils import logging as hf_logging

from worker.engines.models import ModelSource
from worker.errors import ErrorCode, ModelLoadError, RequestError
from worker.wire.messages import InferenceRequest


def resolve_device(choice: str) -> torch.device:
    """``auto`` is CUDA when a GPU is visible, else the CPU."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("engine.device is cuda but torch sees no CUDA device")
    return torch.device(choice)


def resolve_dtype(choice: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU (no fast half-precision kernels there), bf16/fp16 on CUDA."""
    if choice != "auto":
        dtype: torch.dtype = getattr(torch, choice)
        return dtype
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def configure_cpu_threads() -> None:
    """Use the CPUs this process may run on, unless the user chose with OMP_NUM_THREADS.

    torch counts the host's cores, which oversubscribes a container limited to a few.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return
    affinity = getattr(os, "sched_getaffinity", None)
    available = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, available))


def load_tokenizer(source: ModelSource) -> Any:
    """The model's tokenizer, from local files only."""
    gguf: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        return AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True, **gguf)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {source}: {exc}") from exc


def load_pretrained(
    source: ModelSource, device: torch.device, dtype: torch.dtype
) -> tuple[Any, Any]:
    """The model (on ``device``, in eval mode) and its tokenizer, from local files only."""
    # weight-loading progress bars do not belong in a worker's logs
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    tokenizer = load_tokenizer(source)
    gguf: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(source.directory), local_files_only=True, dtype=dtype, **gguf
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot load model from {source}: {exc}") from exc
    return prepare_model(model, tokenizer, device), tokenizer


def prepare_model(model: Any, tokenizer: Any, device: torch.device) -> Any:
    """Move to ``device``, eval mode, and drop the checkpoint's sampling defaults.

    Requests carry their own resolved sampling settings; a checkpoint's
    ``generation_config.json`` (``do_sample``, ``repetition_penalty``, ...) must not
    silently change them, so only the special token ids are kept.
    """
    model = model.to(device).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    old = model.generation_config
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=old.bos_token_id,
        eos_token_id=old.eos_token_id if old.eos_token_id is not None else tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def eos_token_ids(configured: int | Sequence[int] | None, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a generation: the tokenizer's EOS and ``configured``, the
    ``eos_token_id`` of the model's generation config."""
    ids: set[int] = set()
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def model_eos_ids(directory: str, tokenizer: Any) -> frozenset[int]:
    """:func:`eos_token_ids` of a model directory, read from its ``generation_config.json``
    (the tokenizer's EOS alone when it has none), for engines that never load the model."""
    try:
        config = GenerationConfig.from_pretrained(directory)
    except OSError:  # no generation_config.json
        return eos_token_ids(None, tokenizer)
    return eos_token_ids(config.eos_token_id, tokenizer)


class ChatEncoder:
    """Requests to prompt token ids (chat template for ``messages``) and ids back to text.

    Thread-safe: ``encode`` runs on the worker's main thread while the engine thread
    decodes, and a fast tokenizer must not be entered by two threads at once.
    """

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lock = threading.Lock()

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        if request.prompt_token_ids:
            bad = [t for t in request.prompt_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise RequestError(
                    ErrorCode.INVALID_PARAMETER,
                    f"prompt_token_ids outside the vocabulary 0..{self.vocab_size - 1}: {bad[:5]}",
                    request.custom_id,
                )
            return tuple(request.prompt_token_ids)
        with self._lock:
            if request.messages:
                ids = self._chat_ids(request)
            else:
                ids = self.tokenizer(request.prompt or "")["input_ids"]
        if not ids:
            raise RequestError(ErrorCode.INVALID_PARAMETER, "empty prompt", request.custom_id)
        return tuple(int(i) for i in ids)

    def _chat_ids(self, request: InferenceRequest) -> list[int]:
        # intake sets enable_thinking from the request or the configuration; unset is off
        thinking = request.enable_thinking is True
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
            )
        except Exception as exc:  # jinja errors: unsupported roles or order, no template
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"cannot apply the model's chat template: {exc}",
                request.custom_id,
            ) from exc
        # the template already wrote the special tokens (BOS, role markers) it wants
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        with self._lock:
            text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text
