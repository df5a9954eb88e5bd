"""``n`` choices on an engine that generates one sequence per input (hf).

:func:`expand` turns each input asking for ``n`` > 1 choices into ``n`` inputs of one
choice — keys ``key#i``, seeds ``seed + i`` (:meth:`ResolvedSampling.choice_seed`) — and
returns the callback that gathers their completions back into one :class:`Completion`
per original input: choice 0 inline, the others in ``extra_choices``, the generated tokens
of all choices counted, and the first failure failing the whole input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from worker.engines.base import Completion, EngineInput, OnComplete
from worker.wire.messages import Choice


def _merge(key: str, parts: Sequence[Completion]) -> Completion:
    failed = next((part for part in parts if part.error is not None), None)
    if failed is not None:
        return replace(failed, key=key)
    first = parts[0]
    return replace(
        first,
        key=key,
        completion_tokens=sum(part.completion_tokens for part in parts),
        extra_choices=tuple(Choice(p.text, p.finish_reason, p.logprobs) for p in parts[1:]),
    )


def expand(
    inputs: Sequence[EngineInput], on_complete: OnComplete
) -> tuple[list[EngineInput], OnComplete]:
    """One-choice inputs for ``inputs``, and the callback that completes the originals."""
    rows: list[EngineInput] = []
    owners: dict[str, tuple[str, int]] = {}  # row key -> (original key, choice index)
    parts: dict[str, list[Completion | None]] = {}
    for item in inputs:
        n = item.sampling.n
        if n == 1:
            rows.append(item)
            continue
        parts[item.key] = [None] * n
        for i in range(n):
            key = f"{item.key}#{i}"
            owners[key] = (item.key, i)
            sampling = replace(item.sampling, n=1, seed=item.sampling.choice_seed(i))
            rows.append(replace(item, key=key, sampling=sampling))

    def gather(completion: Completion) -> None:
        owner = owners.get(completion.key)
        if owner is None:
            on_complete(completion)
            return
        key, index = owner
        slots = parts[key]
        slots[index] = completion
        done = [part for part in slots if part is not None]
        if len(done) == len(slots):
            on_complete(_merge(key, done))

    return rows, gather
