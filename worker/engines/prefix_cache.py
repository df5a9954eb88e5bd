"""Shared-prefix KV cache for the hf engine: a prompt prefix common to a whole batch is
run through the model once, not once per row, and stays cached for the next batches.

When every prompt of a batch starts with the same ``P`` tokens (a system prompt, a few-shot
preamble), their keys and values for those positions are identical in every row. The
engine then runs only the rows' suffixes, with the prefix's KV cache expanded over the
batch dimension. Layout of each row, ``P`` prefix tokens first and each suffix right-aligned
after its pads::

    [ prefix (P) | pad … pad | suffix_i ]      attention mask [1…1 | 0…0 | 1…1]

transformers derives position ids from the attention mask (cumulative sum), so the
suffix continues at position ``P`` whatever padding sits between: each row sees exactly
the sequence it would see alone, and greedy output does not change (tested on the tiny
model and on SmolLM2).

``P`` is block-aligned (:data:`batcher.formation.PREFIX_BLOCK_TOKENS`, the block the
batcher groups requests by), so batches that share a system prompt but differ just after
it still ask for the same prefix and hit the cache; and it always leaves at least one token
of every prompt to run, since generation starts from the last prompt token's logits.
A small LRU keeps the most recent prefixes, keyed by their token ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from batcher.formation import PREFIX_BLOCK_TOKENS


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

    def expand(self, batch: int, config: Any) -> DynamicCache:
        """A fresh cache holding this prefix for ``batch`` rows; ``generate`` may grow it.

        DynamicCache appends by concatenation, which allocates: the stored tensors behind
        the expanded views are never written to.
        """
        data = [
            (key.expand(batch, -1, -1, -1), value.expand(batch, -1, -1, -1))
            for key, value in self.layers
        ]
        return DynamicCache(ddp_cache_data=data, config=config)


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

    def __len__(self) -> int:
        return len(self._entries)

    def for_batch(self, prompts: Sequence[Sequence[int]], compute: bool = True) -> PrefixKV | None:
        """The cached prefix to run ``prompts`` from, or None when they share less than a
        block. A prefix not in the cache is computed and kept only when ``compute``."""
        length = cacheable_prefix_length(prompts, self.block_tokens)
        if length == 0:
            return None
        tokens = tuple(prompts[0][:length])
        entry = self._entries.get(tokens)
        if entry is not None:
            self._entries.move_to_end(tokens)
            self.hits += 1
            return entry
        if not compute:
            return None
        self.misses += 1
        entry = self._compute(tokens)
        self._entries[tokens] = entry
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return entry

    def clear(self) -> None:
        self._entries.clear()

    def _compute(self, tokens: tuple[int, ...]) -> PrefixKV:
        ids = torch.tensor([tokens], dtype=torch.int64, device=self._model.device)
        with torch.inference_mode():
            cache = self._model(input_ids=ids, use_cache=True).cache
        layers = tuple((layer.keys, layer.values) for layer in cache.layers)
        return PrefixKV(tokens, ids, layers)
