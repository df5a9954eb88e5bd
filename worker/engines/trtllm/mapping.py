"""Resolved sampling settings to TensorRT-LLM's ``SamplingParams``, its results to completions.

Read from the NVIDIA/TensorRT-LLM sources (1.2.x):

* ``tensorrt_llm/sampling_params.py`` — ``SamplingParams`` (a keyword-only dataclass):
  ``top_k=1`` is greedy; "Setting top_p = 0 should result in greedy sampling, but is
  currently disallowed in the backend"; ``top_k=0`` and ``top_p=1`` leave every token in;
  the penalties' neutral values are repetition 1, presence 0, frequency 0. ``_setup``
  takes ``end_id`` from the tokenizer and tokenizes the ``stop`` strings only when
  ``end_id`` is left unset, so it is.
* ``tensorrt_llm/executor/result.py`` — ``CompletionOutput`` (``text``, ``token_ids``,
  ``finish_reason`` in stop | length | timeout | cancelled). A stop string matched as
  tokens has its tokens trimmed from ``token_ids`` unless ``include_stop_str_in_output``;
  one found only in the decoded text cuts the text and keeps ``token_ids`` as generated.
  The EOS token stays in ``token_ids``.
* ``tensorrt_llm/llmapi/llm.py`` (``_check_arguments``) and ``tensorrt_llm/executor/utils.py``
  (``RequestError``): a prompt over the engine's limits is refused with "... should not
  exceed max_num_tokens (N)" (or max_seq_len) — a ``ValueError`` from ``generate_async``
  in earlier 1.x releases, a ``RequestError`` (a ``RuntimeError``) in newer ones, raised by
  ``generate_async`` or by ``aresult()``.
"""

from __future__ import annotations

from typing import Any

from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.errors import ErrorCode


def sampling_kwargs(sampling: ResolvedSampling, *, ignore_eos: bool) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.SamplingParams`` for one request."""
    # top_p == 0 keeps only the most likely token, which is greedy decoding; TensorRT-LLM
    # refuses top_p=0 itself, so it is sent as top_k=1
    greedy = sampling.greedy or sampling.top_p == 0
    return {
        "max_tokens": sampling.max_tokens,
        "temperature": None if greedy else sampling.temperature,
        "top_k": 1 if greedy else sampling.top_k,
        "top_p": None if greedy else sampling.top_p,
        "seed": sampling.seed,
        "stop": list(sampling.stop) or None,
        # token_ids then keep a stop string's tokens, so completion_tokens counts every
        # generated token; the text is cut before the stop string here (completion)
        "include_stop_str_in_output": True,
        "repetition_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "ignore_eos": ignore_eos,
    }


def completion(item: EngineInput, output: Any) -> Completion:
    """The completion of ``item`` from its ``CompletionOutput``."""
    reason = output.finish_reason
    if reason not in ("stop", "length"):
        return failed(item, ErrorCode.ENGINE_FAILED, f"TensorRT-LLM ended the request: {reason}")
    text: str = output.text
    if reason == "stop":
        text = before_stop(text, item.sampling.stop)
    return Completion(
        key=item.key,
        text=text,
        finish_reason=reason,
        prompt_tokens=len(item.prompt_token_ids),
        completion_tokens=len(output.token_ids),
    )


def before_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the earliest of ``stops`` in it (all of it when none occurs)."""
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return text[: min(found)] if found else text


def rejected(item: EngineInput, exc: Exception) -> Completion:
    """``item`` refused by TensorRT-LLM: 4003 when over one of its limits, else 5000."""
    # TensorRT-LLM's limit messages all read "... should not exceed <limit> (N)"
    code = ErrorCode.OVER_LIMIT if "exceed" in str(exc) else ErrorCode.ENGINE_FAILED
    return failed(item, code, f"rejected by TensorRT-LLM: {exc}")


def failed(item: EngineInput, code: ErrorCode, message: str) -> Completion:
    return Completion.failed(item.key, code, message, len(item.prompt_token_ids))
