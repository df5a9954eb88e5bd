"""Log probabilities of generated tokens, read from the model's own logits (hf engine).

:class:`LogprobRecorder` sits first among the logits processors, so it sees each step's
raw logits — the model's distribution before penalties, temperature and the per-row
sampling of :class:`~worker.engines.hf.sampling.RowSampler` (what vLLM reports by
default too). It keeps the step's log-softmax for the rows that asked; once the step's
token is chosen, :meth:`LogprobRecorder.take` (called by the stopping criterion, which
runs after the token is appended) records that token's log probability and the row's
``top_logprobs`` likeliest tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import LogitsProcessor

from worker.engines.base import ResolvedSampling
from worker.wire.messages import TokenLogprob


class LogprobRecorder(LogitsProcessor):
    """Per-row token log probabilities of one ``generate`` call."""

    def __init__(self, rows: Sequence[ResolvedSampling], decode: Callable[[int], str]) -> None:
        self._top = [row.top_logprobs for row in rows]
        self._wanted = [i for i, row in enumerate(rows) if row.logprobs]
        self._decode = decode
        self._pending: dict[int, torch.Tensor] = {}
        #: row -> one entry per generated token so far
        self.tokens: dict[int, list[TokenLogprob]] = {i: [] for i in self._wanted}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for i in self._wanted:
            self._pending[i] = torch.log_softmax(scores[i].float(), dim=-1)
        return scores

    def take(self, input_ids: torch.Tensor, finished: Sequence[bool]) -> None:
        """Record the token each unfinished row just chose (the last of ``input_ids``)."""
        chosen = input_ids[:, -1].tolist()
        for i, logprobs in self._pending.items():
            if finished[i]:
                continue
            top: tuple[TokenLogprob, ...] = ()
            if self._top[i]:
                values, ids = torch.topk(logprobs, self._top[i])
                top = tuple(
                    TokenLogprob(self._decode(t), v)
                    for v, t in zip(values.tolist(), ids.tolist(), strict=True)
                )
            token = chosen[i]
            self.tokens[i].append(TokenLogprob(self._decode(token), float(logprobs[token]), top))
        self._pending.clear()

    def of(self, i: int, count: int) -> tuple[TokenLogprob, ...] | None:
        """Row ``i``'s first ``count`` entries; None when the row asked for none."""
        return tuple(self.tokens[i][:count]) if i in self.tokens else None
