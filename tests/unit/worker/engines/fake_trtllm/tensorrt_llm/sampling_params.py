"""``SamplingParams`` and ``GuidedDecodingParams`` as in ``tensorrt_llm/sampling_params.py``:
the fields the engine sets.

Keyword-only dataclasses. ``SamplingParams._validate`` refuses ``top_p`` outside [0, 1],
negative ``top_k``, negative ``temperature`` and ``n`` > 1 with greedy decoding (top_k 1,
top_p 0 or temperature 0), and keeps ``logprobs`` an int (0 stays falsy: none);
``_setup`` takes ``end_id`` from the tokenizer (never from ``generation_config``, but for
kimi_k2) and tokenizes the ``stop`` strings each on its own, without the text around them
(``_get_stop_reasons_and_words`` pairs ``stop_token_ids``, one word each, and the stop
strings with their words). ``GuidedDecodingParams._validate`` refuses more than one guide.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


@dataclass(kw_only=True)
class SamplingParams:
    end_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    guided_decoding: GuidedDecodingParams | None = None
    _stop_word_ids: list[list[int]] | None = None

    @property
    def _greedy_decoding(self) -> bool:  # params_imply_greedy_decoding
        unset = self.temperature is None and self.top_p is None and self.top_k is None
        return unset or self.top_k == 1 or self.top_p == 0 or self.temperature == 0

    def __post_init__(self) -> None:
        if self.n > 1 and self._greedy_decoding:
            raise ValueError(
                "Greedy decoding in the LLM API does not allow multiple returns. Please set "
                f"to best_of=1, got best_of={self.n}."
            )
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")

    def _setup(self, tokenizer: Any) -> SamplingParams:
        if self.end_id is None:
            self.end_id = int(tokenizer.eos_token_id)
        if self.stop is not None:
            self._stop_word_ids = [
                list(tokenizer.encode(s, add_special_tokens=False)) for s in self._stops()
            ]
        return self

    def _stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def _get_stop_reasons_and_words(self) -> list[tuple[str | int, list[int]]]:
        reasons: list[str | int] = [*(self.stop_token_ids or []), *self._stops()]
        words = [[i] for i in self.stop_token_ids or []] + (self._stop_word_ids or [])
        return list(zip(reasons, words, strict=False))
