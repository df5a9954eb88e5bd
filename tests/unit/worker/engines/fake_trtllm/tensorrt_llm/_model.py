"""The stand-in's "model" and the outputs it fills (``CompletionOutput`` and ``Logprob``
of ``tensorrt_llm/executor/result.py``); ``executor.py`` says which source each behaviour
follows.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sampling_params import SamplingParams


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def end_of_turn(model: str, tokenizer: Any) -> int | None:
    """The first EOS id of the model's ``generation_config.json`` that is not the
    tokenizer's: the token this stand-in model ends its turn with (None: the tokenizer's)."""
    path = Path(model) / "generation_config.json"
    if not model or not path.is_file():
        return None
    configured = json.loads(path.read_text()).get("eos_token_id")
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    others = [int(i) for i in ids if int(i) != tokenizer.eos_token_id]
    return others[0] if others else None


def generate(
    prompt: list[int],
    params: SamplingParams,
    tokenizer: Any,
    turn_end: int | None,
    generator: random.Random,
) -> CompletionOutput:
    """The stand-in model's answer, with stop strings and the end token as described in
    ``executor.py``."""
    source = prompt[::-1]
    ends = int(params.end_id or 0) if turn_end is None else turn_end
    stop_ids = set(params.stop_token_ids or ())
    sampled = not params._greedy_decoding
    vocab = len(tokenizer)
    out = CompletionOutput(0, finish_reason="length")
    likeliest: list[int] = []
    for step in range(params.max_tokens):
        # the turn ends with its end token, then starts over (ignore_eos: no end token)
        at = step % (len(source) if params.ignore_eos else len(source) + 1)
        turn_over = at == len(source)
        best = ends if turn_over else source[at % len(source)]
        token = (best + 1) % vocab if sampled and generator.random() < 0.5 else best
        likeliest.append(best)
        out.token_ids.append(token)
        if token == params.end_id or token in stop_ids:
            out.finish_reason = "stop"
            out.stop_reason = token if token in stop_ids else None
            break
        matched = [
            (reason, ids)
            for reason, ids in params._get_stop_reasons_and_words()
            if ids and out.token_ids[-len(ids) :] == ids
        ]
        if matched:
            out.finish_reason, out.stop_reason = "stop", matched[0][0]
            if not params.include_stop_str_in_output:
                out.token_ids = out.token_ids[: -len(matched[0][1])]
            break
    if params.logprobs:
        out.logprobs = [_logprobs(best, params.logprobs, vocab) for best in likeliest]
        out.logprobs = out.logprobs[: len(out.token_ids)]
    out.text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    for stop in params._stops():
        at = out.text.find(stop)
        if at >= 0:
            cut = at + len(stop) if params.include_stop_str_in_output else at
            out.text, out.finish_reason, out.stop_reason = out.text[:cut], "stop", stop
            break
    return out


def _logprobs(token: int, k: int, vocab: int) -> dict[int, Logprob]:
    """The likeliest ``token`` at log(1/2), and ``k - 1`` other ids, each half as likely:
    TorchSampler's top k, which holds a sampled token only when it ranks among them."""
    entries = {token: Logprob(math.log(0.5), 1)}
    for rank in range(2, k + 1):
        entries[(token + rank) % vocab] = Logprob(math.log(0.5**rank), rank)
    return entries
