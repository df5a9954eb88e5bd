"""Shared-prefix KV cache for the hf engine: a prompt prefix that several rows of a batch
share is run through the model once, not once per row, and stays cached for later batches.

Rows that start with the same ``P`` tokens (a system prompt, a few-shot preamble) have
identical keys and values at those positions. The batch runs as one ``generate`` call
over two regions, the first served as a ready KV cache::

    group row:  [ shared prefix (P, cached)  | pad … pad | rest of the prompt ]
    other row:  [ pad … | its first ≤P tokens | pad … pad | rest of the prompt ]
                 region A: KV cache, width P   region B: prefilled by generate

Group rows take region A from the LRU (computed once for the prefix); the other rows' own
region A is computed by one extra forward pass over just those rows. Every pad is masked,
and transformers derives position ids from the attention mask (cumulative sum), so each
row sees exactly the positions and tokens it would see alone: greedy output is unchanged
(tested on the tiny model and on SmolLM2). Regions A and B together are exactly as wide as
the longest prompt, so no row attends over more positions than in a plain left-padded
batch, and prefill runs ``group size × P`` fewer positions (``P`` more on a cache miss).

``P`` is block-aligned (:data:`batcher.formation.PREFIX_BLOCK_TOKENS`, the block the
batcher groups requests by), so batches that share a system prompt but differ right after
it ask for the same prefix and hit the cache; and it leaves at least one token of every
group row to region B, since generation starts from the last prompt token's logits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from batcher.formation import PREFIX_BLOCK_TOKENS

Stage = Callable[[Sequence[Sequence[int]]], tuple[torch.Tensor, torch.Tensor]]
"""Left-pads rows of token ids into ``(input_ids, attention_mask)`` on the model's device.

Called at most twice per batch, and both results are used together: the engine's staging
pool has two slots, so neither overwrites the other."""


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens at the start of every prompt that all prompts share."""
    if not prompts:
        return 0
    first = prompts[0]
    shared = min(len(p) for p in prompts)
    for prompt in prompts[1:]:
        for i in range(shared):
            if prompt[i] != first[i]:
                shared = i
                break
    return shared


def cacheable_prefix_length(
    prompts: Sequence[Sequence[int]], block_tokens: int = PREFIX_BLOCK_TOKENS
) -> int:
    """The prefix length to serve from the cache: shared by all prompts, a whole number of
    blocks, and shorter than the shortest prompt (0 when that is less than one block)."""
    if not prompts:
        return 0
    usable = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
    return usable // block_tokens * block_tokens


@dataclass(frozen=True)
class PrefixKV:
    """The keys and values of one prefix, batch size 1: ``(key, value)`` per layer, each
    ``[1, kv_heads, len(tokens), head_dim]``, and its token ids as a ``[1, len(tokens)]``
    tensor, all on the model's device. Never modified once computed."""

    tokens: tuple[int, ...]
    ids: torch.Tensor
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PrefixPlan:
    """Rows ``group`` (indices into the batch) start with ``entry.tokens``; ``others`` do not."""

    entry: PrefixKV
    group: tuple[int, ...]
    others: tuple[int, ...]

    @property
    def saved_positions(self) -> int:
        return len(self.group) * self.entry.length


class PrefixCache:
    """The ``capacity`` most recently used prefixes of one model, computed on demand.

    Used by the engine thread only (not thread-safe).
    """

    def __init__(
        self, model: Any, capacity: int = 4, block_tokens: int = PREFIX_BLOCK_TOKENS
    ) -> None:
        if capacity < 1 or block_tokens < 1:
            raise ValueError("capacity and block_tokens must be >= 1")
        self._model = model
        self._capacity = capacity
        self.block_tokens = block_tokens
        self._entries: OrderedDict[tuple[int, ...], PrefixKV] = OrderedDict()
        self.hits = 0
        self.misses = 0
        #: prefill positions not run thanks to the cache, net of computing prefixes on a miss
        self.positions_saved = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def plan(self, prompts: Sequence[Sequence[int]]) -> PrefixPlan | None:
        """The rows to serve from one cached prefix, or None when no prefix is worth it.

        Rows are grouped by their first block; the group saving the most positions wins.
        A group of two or more computes its prefix on a miss; a lone row only uses a prefix
        already cached (computing it would save nothing).
        """
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, prompt in enumerate(prompts):
            if len(prompt) > self.block_tokens:
                groups.setdefault(tuple(prompt[: self.block_tokens]), []).append(i)
        best: tuple[list[int], tuple[int, ...], PrefixKV | None] | None = None
        for rows in groups.values():
            length = cacheable_prefix_length([prompts[i] for i in rows], self.block_tokens)
            tokens = tuple(prompts[rows[0]][:length])
            entry = self._entries.get(tokens)
            if entry is None and len(rows) == 1:
                entry = self._longest_cached(tokens)
                if entry is None:
                    continue
                tokens = entry.tokens
            if best is None or len(rows) * len(tokens) > len(best[0]) * len(best[1]):
                best = (rows, tokens, entry)
        if best is None:
            return None
        rows, tokens, entry = best
        if entry is None:
            self.misses += 1
            self.positions_saved -= len(tokens)
            entry = self._compute(tokens)
            self._entries[tokens] = entry
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        else:
            self.hits += 1
            self._entries.move_to_end(tokens)
        group = set(rows)
        others = tuple(i for i in range(len(prompts)) if i not in group)
        plan = PrefixPlan(entry, tuple(rows), others)
        self.positions_saved += plan.saved_positions
        return plan

    def inputs(
        self, plan: PrefixPlan, prompts: Sequence[Sequence[int]], stage: Stage, pad: int
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
        """``generate``'s input ids, attention mask and starting cache for ``plan``."""
        entry, batch = plan.entry, len(prompts)
        width = entry.length
        group = set(plan.group)
        # a group row's region A is the prefix; another row's is as much of it as fits
        cut = [width if i in group else min(width, len(p) - 1) for i, p in enumerate(prompts)]
        heads = [p[:n] for p, n in zip(prompts, cut, strict=True)]
        tail_ids, tail_mask = stage([p[n:] for p, n in zip(prompts, cut, strict=True)])
        head_ids = entry.ids.expand(batch, -1)
        head_mask = torch.ones_like(head_ids)
        # expanded views: DynamicCache copies them on its first append, never writes to them
        layers = [
            (key.expand(batch, -1, -1, -1), value.expand(batch, -1, -1, -1))
            for key, value in entry.layers
        ]
        if plan.others:
            rows = torch.tensor(plan.others, device=head_ids.device)
            ids, mask = stage([heads[i] for i in plan.others])
            # rows shorter than the prefix: pad region A to its full width, on the left
            ids = torch.nn.functional.pad(ids, (width - ids.shape[1], 0), value=pad)
            mask = torch.nn.functional.pad(mask, (width - mask.shape[1], 0), value=0)
            head_ids, head_mask = head_ids.clone(), head_mask.clone()
            head_ids[rows], head_mask[rows] = ids, mask
            own = self._forward(ids, mask)
            layers = [(key.clone(), value.clone()) for key, value in layers]
            for (key, value), (own_key, own_value) in zip(layers, own, strict=True):
                key[rows], value[rows] = own_key, own_value
        input_ids = torch.cat([head_ids, tail_ids], dim=1)
        attention_mask = torch.cat([head_mask, tail_mask], dim=1)
        cache = DynamicCache(ddp_cache_data=layers, config=self._model.config)
        return input_ids, attention_mask, cache

    def _longest_cached(self, tokens: tuple[int, ...]) -> PrefixKV | None:
        fits = [e for key, e in self._entries.items() if key == tokens[: len(key)]]
        return max(fits, key=lambda e: e.length, default=None)

    def _compute(self, tokens: tuple[int, ...]) -> PrefixKV:
        ids = torch.tensor([tokens], dtype=torch.int64, device=self._model.device)
        layers = self._forward(ids, torch.ones_like(ids))
        return PrefixKV(tokens, ids, tuple(layers))

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of left-padded ``ids``; positions count real tokens only."""
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            # logits_to_keep=1: the LM head over every position would cost more than the layers
            cache = self._model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            ).past_key_values
        return [(layer.keys, layer.values) for layer in cache.layers]
