"""Which queued requests go into the next batch.

The anchor — the highest-priority, oldest queued request — always goes in, so nothing
starves: the oldest request leaves in the very next batch. The rest of the batch is filled
under the count and token limits:

* FIFO (``length_aware`` and ``shared_prefix`` off): in queue order, stopping at the first
  request that does not fit, so order within a priority is kept exactly.
* Otherwise candidates are ranked by priority first, then (``shared_prefix``) whether they
  share the anchor's prefix key, then (``length_aware``) how far their prompt length and
  ``max_tokens`` are from the anchor's, then age. A candidate that does not fit the token
  budget is skipped and a smaller one may take its place.

Length distance counts prompt and generation lengths alike: a static batch pads every
prompt to the longest and decodes until the longest generation budget is spent, so either
mismatch wastes compute on every row.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from batcher.types import Pending, T

PREFIX_BLOCK_TOKENS = 32
"""Tokens per prefix block; matches common KV-cache block sizes (TensorRT-LLM, vLLM)."""


def prefix_key_of(
    token_ids: Sequence[int], block_tokens: int = PREFIX_BLOCK_TOKENS
) -> bytes | None:
    """Hash of the first ``block_tokens`` prompt tokens, or None for a shorter prompt.

    Requests with equal keys start with the same full KV-cache block, which an engine with
    prefix caching computes once for all of them.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if len(token_ids) < block_tokens:
        return None
    head = array("q", token_ids[:block_tokens]).tobytes()  # one C call, not a loop per token
    return hashlib.blake2b(head, digest_size=16).digest()


def length_distance(a: Pending[T], b: Pending[T]) -> int:
    """How badly two requests pad each other in a static batch (0 = same shape)."""
    return abs(a.prompt_tokens - b.prompt_tokens) + abs(a.max_tokens - b.max_tokens)


def _ranking(
    anchor: Pending[T], length_aware: bool, shared_prefix: bool
) -> Callable[[Pending[T]], tuple[int, int, int]]:
    share = shared_prefix and anchor.prefix_key is not None

    def rank(item: Pending[T]) -> tuple[int, int, int]:
        differs = int(share and item.prefix_key != anchor.prefix_key)
        distance = length_distance(anchor, item) if length_aware else 0
        return (-item.priority, differs, distance)

    return rank


def select(
    queue: Sequence[Pending[T]],
    max_size: int,
    max_tokens: int,
    *,
    length_aware: bool,
    shared_prefix: bool,
) -> list[Pending[T]]:
    """The next batch from ``queue`` (priority order, oldest first within a priority).

    ``queue[0]`` is the anchor and is always selected. The result never holds more than
    ``max_size`` items or ``max_tokens`` tokens (given the anchor alone fits).
    """
    if not queue:
        return []
    anchor = queue[0]
    chosen = [anchor]
    budget = max_tokens - anchor.tokens
    if not (length_aware or shared_prefix):
        for item in queue[1:]:
            if len(chosen) >= max_size or item.tokens > budget:
                break
            chosen.append(item)
            budget -= item.tokens
        return chosen
    # sorted() is stable: equal ranks keep queue order, i.e. oldest first.
    for item in sorted(queue[1:], key=_ranking(anchor, length_aware, shared_prefix)):
        if len(chosen) >= max_size:
            break
        if item.tokens <= budget:
            chosen.append(item)
            budget -= item.tokens
    return chosen
