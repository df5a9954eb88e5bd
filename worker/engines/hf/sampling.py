"""Per-request sampling and stopping inside one static ``generate`` batch.

transformers applies one set of sampling settings and one random generator to a whole
batch. batchpipe batches requests with different settings, so ``generate`` runs greedy
and these two hooks make every row honour its own request:

* :class:`RowSampler` (a logits processor) applies each row's penalties and, for sampled
  rows, draws the token with the row's own ``torch.Generator`` (seeded from the request's
  ``seed``) and masks every other token, so the greedy step picks the draw. A seeded row
  therefore gives the same tokens whatever else is in the batch.
* :class:`RowTracker` (a stopping criterion) ends each row at its own EOS, stop string
  or ``max_tokens`` and reports it through ``on_complete`` at once, not at the end of
  the batch.

Penalties: ``repetition_penalty`` as transformers defines it (over prompt and output,
pad excluded); ``presence_penalty`` / ``frequency_penalty`` as OpenAI defines them
(subtracted from the logits of tokens already generated, once / per occurrence).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, StoppingCriteria

from worker.config import GenerationConfig
from worker.engines.base import Completion, EngineInput, OnComplete
from worker.wire.messages import FinishReason, SamplingParams


@dataclass(frozen=True)
class RowSettings:
    """One request's sampling settings with the worker's defaults filled in."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @classmethod
    def resolve(cls, sampling: SamplingParams, defaults: GenerationConfig) -> RowSettings:
        return cls(
            max_tokens=sampling.max_tokens
            if sampling.max_tokens is not None
            else defaults.max_tokens,
            temperature=sampling.temperature
            if sampling.temperature is not None
            else defaults.temperature,
            top_p=sampling.top_p if sampling.top_p is not None and sampling.top_p < 1 else None,
            top_k=sampling.top_k if sampling.top_k is not None and sampling.top_k > 0 else None,
            seed=sampling.seed,
            stop=tuple(s for s in sampling.stop if s),
            repetition_penalty=sampling.repetition_penalty
            if sampling.repetition_penalty not in (None, 1.0)
            else None,
            presence_penalty=sampling.presence_penalty or None,
            frequency_penalty=sampling.frequency_penalty or None,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with no penalty: the logits need no per-row work."""
        return self.greedy and not (
            self.repetition_penalty or self.presence_penalty or self.frequency_penalty
        )


class RowSampler(LogitsProcessor):
    """Each row's penalties and sampling; leaves plain greedy rows untouched."""

    def __init__(
        self, rows: Sequence[RowSettings], prompt_lengths: Sequence[int], padded_length: int
    ) -> None:
        self._rows = rows
        self._prompt_lengths = prompt_lengths
        self._padded = padded_length
        self._active = [i for i, row in enumerate(rows) if not row.plain_greedy]
        self._generators: dict[int, torch.Generator] = {}
        self._seeds = {
            i: row.seed if row.seed is not None else secrets.randbits(63)
            for i, row in enumerate(rows)
            if not row.greedy
        }

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for i in self._active:
            row = self._rows[i]
            logits = scores[i]
            if row.repetition_penalty:
                seen = torch.unique(input_ids[i, self._padded - self._prompt_lengths[i] :])
                picked = logits[seen]
                logits[seen] = torch.where(
                    picked > 0, picked / row.repetition_penalty, picked * row.repetition_penalty
                )
            generated = input_ids[i, self._padded :]
            if (row.presence_penalty or row.frequency_penalty) and generated.numel():
                counts = torch.bincount(generated, minlength=logits.numel())[: logits.numel()]
                counts = counts.to(logits.dtype)
                logits -= (row.frequency_penalty or 0.0) * counts
                logits -= (row.presence_penalty or 0.0) * (counts > 0).to(logits.dtype)
            if not row.greedy:
                choice = self._draw(i, row, logits)
                logits.fill_(float("-inf"))
                logits[choice] = 0.0
        return scores

    def _draw(self, i: int, row: RowSettings, logits: torch.Tensor) -> torch.Tensor:
        generator = self._generators.get(i)
        if generator is None:
            generator = torch.Generator(device=logits.device).manual_seed(self._seeds[i])
            self._generators[i] = generator
        scaled = logits / row.temperature
        if row.top_k is not None and row.top_k < scaled.numel():
            kth = torch.topk(scaled, row.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if row.top_p is not None:
            ordered, order = torch.sort(scaled, descending=True)
            probs = ordered.softmax(-1)
            # drop a token once the mass before it already reaches top_p; the first stays
            drop = probs.cumsum(-1) - probs >= row.top_p
            scaled = scaled.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
        return torch.multinomial(scaled.softmax(-1), 1, generator=generator)


class RowTracker(StoppingCriteria):
    """Ends each row at EOS, a stop string or ``max_tokens`` and completes it right away.

    ``completion_tokens`` counts generated tokens through the EOS or the stop string's
    last token; the text excludes both, as the OpenAI API does.
    """

    def __init__(
        self,
        inputs: Sequence[EngineInput],
        rows: Sequence[RowSettings],
        padded_length: int,
        eos_ids: frozenset[int],
        decode: Callable[[Sequence[int]], str],
        on_complete: OnComplete,
    ) -> None:
        self._inputs = inputs
        self._rows = rows
        self._padded = padded_length
        self._eos = eos_ids
        self._decode = decode
        self._on_complete = on_complete
        self.finished = [False] * len(inputs)

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        generated = input_ids.shape[1] - self._padded
        last = input_ids[:, -1].tolist()
        for i, row in enumerate(self._rows):
            if self.finished[i]:
                continue
            if last[i] in self._eos:
                self._finish(i, self._decode(self._tokens(input_ids, i)[:-1]), "stop", generated)
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
        for i in range(len(self._rows)):
            if not self.finished[i]:
                tokens = sequences[i, self._padded :].tolist()
                self._finish(i, self._decode(tokens), "length", len(tokens))

    def _finish(self, i: int, text: str, reason: FinishReason, generated: int) -> None:
        self.finished[i] = True
        item = self._inputs[i]
        self._on_complete(
            Completion(
                key=item.key,
                text=text,
                finish_reason=reason,
                prompt_tokens=len(item.prompt_token_ids),
                completion_tokens=generated,
            )
        )
