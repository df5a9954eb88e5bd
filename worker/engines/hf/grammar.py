"""Structured outputs on the hf engine: ``response_format`` through xgrammar, row by row.

:class:`Grammars` compiles a request's response format into a grammar over the model's
vocabulary with xgrammar (``GrammarCompiler``, which caches what it compiled), once at
admission — a schema it cannot compile is a 4002 naming xgrammar's reason — and again, from
its cache, when the batch runs. :class:`GrammarMask` is the logits processor: each row
with a grammar has its own ``GrammarMatcher``; at every step it accepts the row's last
token and masks every token the grammar forbids next (once the JSON is complete, only the
end-of-sequence tokens), leaving rows without a grammar untouched.

Compilation choices: ``json_object`` is the schema ``{"type": "object"}``; the JSON is
compact (``any_whitespace=False``: a model cannot stall in endless whitespace); a
``json_schema`` is compiled in strict mode (no properties beyond those listed) unless the
request says ``strict: false``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

from worker.errors import ErrorCode, RequestError
from worker.wire.messages import ResponseFormat


class Grammars:
    """Compiled grammars of response formats for one tokenizer and vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Collection[int]) -> None:
        import xgrammar as xgr  # imported with the first structured request, not before

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_ids)
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
        self.vocab_size = vocab_size

    def compile(self, fmt: ResponseFormat, custom_id: str | None = None) -> Any:
        """The compiled grammar of ``fmt`` (not ``text``); 4002 when it cannot be compiled."""
        try:
            return self._compiler.compile_json_schema(
                fmt.constraint, any_whitespace=False, strict_mode=fmt.strict_mode
            )
        except Exception as exc:  # xgrammar raises RuntimeError or ValueError with its reason
            raise RequestError(
                ErrorCode.INVALID_PARAMETER,
                f"response_format: the schema cannot be compiled into a grammar: {exc}",
                custom_id,
                param="response_format",
            ) from exc


class GrammarMask(LogitsProcessor):
    """Masks each constrained row's logits to what its grammar allows next.

    ``finished`` is the stopping criterion's list: a finished row is padded by
    ``generate`` from then on, and its matcher must not see the padding.
    """

    def __init__(
        self, grammars: Sequence[Any | None], finished: Sequence[bool], vocab: int
    ) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self._matchers = {i: xgr.GrammarMatcher(g) for i, g in enumerate(grammars) if g is not None}
        self._bitmask = xgr.allocate_token_bitmask(len(grammars), vocab)
        self._finished = finished
        self._vocab = vocab
        self._started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        last = input_ids[:, -1].tolist()
        rows = []
        for i, matcher in self._matchers.items():
            if self._finished[i] or matcher.is_terminated():
                continue
            if self._started and not matcher.accept_token(last[i]):
                raise RuntimeError(f"row {i} produced token {last[i]} its grammar forbids")
            matcher.fill_next_token_bitmask(self._bitmask, i)
            rows.append(i)
        self._started = True
        if rows:
            self._xgr.apply_token_bitmask_inplace(
                scores, self._bitmask.to(scores.device), vocab_size=self._vocab, indices=rows
            )
        return scores
