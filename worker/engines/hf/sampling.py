"""Per-request sampling and stopping inside one static ``generate`` batch.

transformers applies one set of sampling settings and one random generator to a whole
batch. batchpipe batches requests with different settings, so ``generate`` runs greedy
and these two hooks make every row honour its own request:

* :class:`RowSampler` (a logits processor) applies each row's penalties and, for sampled
  rows, draws the token with the row's own ``torch.Generator`` (seeded from the resolved
  ``seed``) and masks every other token, so the greedy step picks the draw. A row
  therefore gives the same tokens for the same seed whatever else is in the batch.
* :class:`RowTracker` (a stopping criterion) ends each row at its own EOS, stop string
  or ``max_tokens`` and reports it through ``on_complete`` at once, not at the end of
  the batch.

Penalties: ``repetition_penalty`` as transformers defines it (over prompt and output,
pad excluded); ``presence_penalty`` / ``frequency_penalty`` as OpenAI defines them
(subtracted from the logits of tokens already generated, once / per occurrence).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import LogitsProcessor, StoppingCriteria

from worker.engines.base import Completion, EngineInput, OnComplete, ResolvedSampling
from worker.engines.hf.logprobs import LogprobRecorder
from worker.wire.messages import FinishReason


def plain_greedy(row: ResolvedSampling) -> bool:
    """Greedy with no penalty: the logits need no per-row work."""
    return row.greedy and not row.penalized


class RowSampler(LogitsProcessor):
    """Each row's penalties and sampling; leaves plain greedy rows untouched."""

    def __init__(
        self, rows: Sequence[ResolvedSampling], prompt_lengths: Sequence[int], padded_length: int
    ) -> None:
        self._rows = rows
        self._prompt_lengths = prompt_lengths
        self._padded = padded_length
        self._active = [i for i, row in enumerate(rows) if not plain_greedy(row)]
        self._generators: dict[int, torch.Generator] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for i in self._active:
            row = self._rows[i]
            logits = scores[i]
            if row.repetition_penalty != 1.0:
                seen = torch.unique(input_ids[i, self._padded - self._prompt_lengths[i] :])
                picked = logits[seen]
                logits[seen] = torch.where(
                    picked > 0, picked / row.repetition_penalty, picked * row.repetition_penalty
                )
            generated = input_ids[i, self._padded :]
            if (row.presence_penalty or row.frequency_penalty) and generated.numel():
                counts = torch.bincount(generated, minlength=logits.numel())[: logits.numel()]
                counts = counts.to(logits.dtype)
                logits -= row.frequency_penalty * counts
                logits -= row.presence_penalty * (counts > 0).to(logits.dtype)
            if not row.greedy:
                choice = self._draw(i, row, logits)
                logits.fill_(float("-inf"))
                logits[choice] = 0.0
        return scores

    def _draw(self, i: int, row: ResolvedSampling, logits: torch.Tensor) -> torch.Tensor:
        generator = self._generators.get(i)
        if generator is None:
            generator = torch.Generator(device=logits.device).manual_seed(row.seed)
            self._generators[i] = generator
        scaled = logits / row.temperature
        if 0 < row.top_k < scaled.numel():
            kth = torch.topk(scaled, row.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if row.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            probs = ordered.softmax(-1)
            # drop a token once the mass before it already reaches top_p; the first stays
            drop = probs.cumsum(-1) - probs >= row.top_p
            scaled = scaled.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
        return torch.multinomial(scaled.softmax(-1), 1, generator=generator)


class RowTracker(StoppingCriteria):
    """Ends each row at EOS, a stop string or ``max_tokens`` and completes it right away.

    ``completion_tokens`` counts generated tokens through the EOS or the stop string's
    last token; the text excludes both, as the OpenAI API does. With a ``recorder``, rows
    that asked for logprobs get one entry per generated token, the EOS excluded.
    """

    def __init__(
        self,
        inputs: Sequence[EngineInput],
        padded_length: int,
        eos_ids: frozenset[int],
        decode: Callable[[Sequence[int]], str],
        on_complete: OnComplete,
        recorder: LogprobRecorder | None = None,
    ) -> None:
        self._inputs = inputs
        self._padded = padded_length
        self._eos = eos_ids
        self._decode = decode
        self._on_complete = on_complete
        self._recorder = recorder
        self.finished = [False] * len(inputs)

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        generated = input_ids.shape[1] - self._padded
        if self._recorder is not None:
            self._recorder.take(input_ids, self.finished)
        last = input_ids[:, -1].tolist()
        for i, item in enumerate(self._inputs):
            if self.finished[i]:
                continue
            row = item.sampling
            if last[i] in self._eos:
                text = self._decode(self._tokens(input_ids, i)[:-1])
                self._finish(i, text, "stop", generated, generated - 1)
            elif row.stop and (hits := self._stop_hits(input_ids, i, row.stop)) is not None:
                self._finish(i, hits, "stop", generated)
            elif generated >= row.max_tokens:
                self._finish(i, self._decode(self._tokens(input_ids, i)), "length", generated)
        return torch.tensor(self.finished, dtype=torch.bool, device=input_ids.device)

    def _tokens(self, input_ids: torch.Tensor, i: int) -> list[int]:
        tokens: list[int] = input_ids[i, self._padded :].tolist()
        return tokens

    def _stop_hits(self, input_ids: torch.Tensor, i: int, stop: tuple[str, ...]) -> str | None:
        """The text before the first stop string, or None while no stop string appeared."""
        text = self._decode(self._tokens(input_ids, i))
        hits = [text.find(s) for s in stop if s in text]
        return text[: min(hits)] if hits else None

    def finish_rest(self, sequences: torch.Tensor) -> None:
        """Complete rows ``generate`` left unfinished (it stopped on its own length limit)."""
        for i in range(len(self._inputs)):
            if not self.finished[i]:
                tokens = sequences[i, self._padded :].tolist()
                self._finish(i, self._decode(tokens), "length", len(tokens))

    def _finish(
        self, i: int, text: str, reason: FinishReason, generated: int, kept: int | None = None
    ) -> None:
        """Complete row ``i``; ``kept`` tokens have logprobs (default: all ``generated``)."""
        self.finished[i] = True
        item = self._inputs[i]
        recorder = self._recorder
        self._on_complete(
            Completion(
                key=item.key,
                text=text,
                finish_reason=reason,
                prompt_tokens=len(item.prompt_token_ids),
                completion_tokens=generated,
                logprobs=None
                if recorder is None
                else recorder.of(i, generated if kept is None else kept),
            )
        )
