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
* ``tensorrt_llm/sampling_params.py`` — ``GuidedDecodingParams(json=..., json_object=...)``
  (one guide per request) and ``SamplingParams.logprobs`` (an int: that many likeliest
  tokens per generated token; ``logprobs=0`` asks for none, ``_validate`` keeps it falsy).
  ``n`` > 1 with greedy decoding is refused by ``_validate`` ("Greedy decoding in the LLM
  API does not allow multiple returns") and all ``n`` draw from one seed, so the engine
  runs n requests of one choice instead (:mod:`~worker.engines.trtllm.engine`).
* ``tensorrt_llm/_torch/pyexecutor/grammar_matcher.py`` — the xgrammar backend compiles
  ``json_object`` (guide type JSON) with ``compile_builtin_json_grammar()``, which takes
  any JSON value, an array or a string too; so ``json_object`` goes as the schema
  ``{"type": "object"}`` (guide type JSON_SCHEMA, ``compile_json_schema``: strict mode,
  xgrammar's default).
* ``tensorrt_llm/executor/result.py`` — ``CompletionOutput.logprobs`` on the PyTorch
  backend: one ``{token id: Logprob(logprob, rank)}`` per token of ``token_ids``, the end
  token's included; ``stop_reason`` stays None when the end token ended it, and is the id
  when one of ``stop_token_ids`` did.
* ``tensorrt_llm/_torch/pyexecutor/sampler.py`` — ``TorchSampler`` (the default sampler of
  the PyTorch backend in 1.2.x): its logprobs are the top k of the raw log-softmax, so a
  sampled token that is not among them has no entry (that answer fails alone, 5000); it
  applies no penalty and draws every request from one generator seeded 42, so the engine
  refuses ``seed`` and the penalties (:class:`~worker.engines.trtllm.engine.TrtLlmEngine`).
* Stop strings: ``SamplingParams._setup`` tokenizes each alone, so the token match can
  miss one that the text then holds; generation has run on. The text is cut before it and
  the tokens up to the one that completes it are counted (:func:`tokens_to_stop`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.library import token_logprobs
from worker.errors import ErrorCode
from worker.wire.messages import Choice, FinishReason, ResponseFormat


def sampling_kwargs(
    sampling: ResolvedSampling, *, ignore_eos: bool, stop_token_ids: Sequence[int] = ()
) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.SamplingParams`` for one request;
    ``stop_token_ids``: the model's EOS ids beside the tokenizer's (its end of turn)."""
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
        # TensorRT-LLM's end_id is the tokenizer's EOS only; the model's generation_config
        # may name more (a chat model's end of turn), which end a generation on hf too
        "stop_token_ids": None if ignore_eos or not stop_token_ids else list(stop_token_ids),
        # token_ids then keep a stop string's tokens, so completion_tokens counts every
        # generated token; the text is cut before the stop string here (completion)
        "include_stop_str_in_output": True,
        "repetition_penalty": sampling.repetition_penalty,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "ignore_eos": ignore_eos,
        # logprobs=0 would ask for nothing: the chosen token's value needs at least 1
        "logprobs": max(1, sampling.top_logprobs) if sampling.logprobs else None,
    }


def guide_kwargs(fmt: ResponseFormat) -> dict[str, Any] | None:
    """Keyword arguments of ``tensorrt_llm.sampling_params.GuidedDecodingParams`` for
    ``fmt``; None for free text."""
    if fmt.type == "text":
        return None
    return {"json": fmt.constraint}


Decode = Callable[[Sequence[int]], str]


def completion(item: EngineInput, outputs: Sequence[Any], decode: Decode) -> Completion:
    """The completion of ``item`` from the ``CompletionOutput`` of each of its choices;
    ``decode`` turns token ids into text as the worker's tokenizer does."""
    choices, counted = [], 0
    for output in outputs:
        reason = output.finish_reason
        if reason not in ("stop", "length"):
            return failed(
                item, ErrorCode.ENGINE_FAILED, f"TensorRT-LLM ended the request: {reason}"
            )
        choice, tokens = _choice(item.sampling, output, decode)
        choices.append(choice)
        counted += tokens
    first, *others = choices
    return Completion(
        key=item.key,
        text=first.text,
        finish_reason=first.finish_reason,
        prompt_tokens=len(item.prompt_token_ids),
        completion_tokens=counted,
        logprobs=first.logprobs,
        extra_choices=tuple(others),
    )


def _choice(sampling: ResolvedSampling, output: Any, decode: Decode) -> tuple[Choice, int]:
    """One choice and the number of tokens it generated up to where it ends."""
    text: str = output.text
    ids = list(output.token_ids)
    reason: FinishReason = "length" if output.finish_reason == "length" else "stop"
    cut = before_stop(text, sampling.stop)
    if cut != text:  # a stop string in the text: the answer ends there, whatever ran on
        text, reason = cut, "stop"
        ids = ids[: tokens_to_stop(ids, sampling.stop, decode)]
    logprobs = None
    if sampling.logprobs:
        entries = list(output.logprobs or [])
        # the end token (or a stop token id) is not part of the answer: no entry (as hf)
        ended = reason == "stop" and (output.stop_reason is None or _is_id(output.stop_reason))
        shown = ids[:-1] if ended and len(ids) == len(output.token_ids) else ids
        for at, token in enumerate(shown):
            if at >= len(entries) or token not in entries[at]:
                raise ValueError(
                    f"TensorRT-LLM's logprobs at token {at} omit the sampled token {token} "
                    "(its sampler reports the top k of the raw distribution)"
                )
        logprobs = token_logprobs(shown, entries, sampling.top_logprobs, lambda t: decode([t]))
    return Choice(text, reason, logprobs), len(ids)


def _is_id(reason: object) -> bool:
    return isinstance(reason, int) and not isinstance(reason, bool)


def tokens_to_stop(ids: Sequence[int], stops: Sequence[str], decode: Decode) -> int:
    """The fewest leading ``ids`` whose text holds one of ``stops`` (all of them when
    none does): the tokens generated up to the stop, found by bisection."""
    if not stops or not any(stop in decode(ids) for stop in stops):
        return len(ids)
    low, high = 1, len(ids)  # the prefix of ``high`` ids holds a stop
    while low < high:
        middle = (low + high) // 2
        if any(stop in decode(ids[:middle]) for stop in stops):
            high = middle
        else:
            low = middle + 1
    return high


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
