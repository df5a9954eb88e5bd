"""Which queued requests go into the next batch.

The anchor — the first queued request: the highest effective priority (priority raised by
its wait, see :mod:`batcher.batcher`) — always goes in, so nothing starves. The rest of the
batch is filled under the count and token limits:

* FIFO (``length_aware`` and ``shared_prefix`` off): in queue order, stopping at the first
  request that does not fit, so order within a priority is kept exactly.
* Otherwise candidates are ranked by effective priority level first
  (:func:`effective_priority`: a request that waited long enough competes with fresh
  higher-priority ones as an equal), then (``shared_prefix``) whether they share the
  anchor's prefix key, then (``length_aware``) how far their prompt length and
  ``max_tokens`` are from the anchor's, then queue order. A candidate that does not fit the
  token budget is skipped and a smaller one may take its place.

Length distance counts prompt and generation lengths alike: a static batch pads every
prompt to the longest and decodes until the longest generation budget is spent, so either
mismatch wastes compute on every row.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Sequence

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


def effective_priority(item: Pending[T], now: float, aging_s: float) -> int:
    """``item``'s priority plus one level per ``aging_s`` it has waited by ``now``."""
    return item.priority + math.floor((now - item.arrival) / aging_s)


def select(
    queue: Sequence[Pending[T]],
    max_size: int,
    max_tokens: int,
    *,
    length_aware: bool,
    shared_prefix: bool,
    now: float = 0.0,
    aging_s: float = math.inf,
) -> list[Pending[T]]:
    """The next batch from ``queue`` (in the batcher's order: the anchor first).

    ``queue[0]`` is the anchor and is always selected. The result never holds more than
    ``max_size`` items or ``max_tokens`` tokens (given the anchor alone fits). Candidates
    are ranked by their effective priority at ``now`` under ``aging_s``; the default,
    no aging, ranks them by priority alone.
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
    rest = queue[1:]
    for i in _ranked(anchor, rest, length_aware, shared_prefix, now, aging_s):
        if len(chosen) >= max_size:
            break
        item = rest[i]
        if item.tokens <= budget:
            chosen.append(item)
            budget -= item.tokens
    return chosen


_INDEX = (1 << 32) - 1


def _ranked(
    anchor: Pending[T],
    rest: Sequence[Pending[T]],
    length_aware: bool,
    shared_prefix: bool,
    now: float,
    aging_s: float,
) -> list[int]:
    """Indices of ``rest`` from best to worst candidate (module doc): by effective
    priority level (:func:`effective_priority`, highest first), then (``shared_prefix``)
    sharing the anchor's prefix key first, then (``length_aware``) the smallest
    :func:`length_distance` to the anchor, then queue order (the batcher's aged order).

    Worked out in one comprehension with the anchor's values in locals, each rank one int:
    formation ranks the whole queue for every batch, so with a deep queue
    (``prefetch_count`` in the thousands) per-item function calls and tuple comparisons
    were most of the batch stage (issue 25).
    """
    share = shared_prefix and anchor.prefix_key is not None
    prefix, prompt, generate = anchor.prefix_key, anchor.prompt_tokens, anchor.max_tokens
    floor = math.floor
    # each rank packed into one int, (level, differs, distance, index) from the most
    # significant end: sorting ints is much cheaper than sorting tuples, and the index
    # keeps ties in queue order (distance < 2**64, index < 2**32)
    keys = [
        (
            (
                (-(item.priority + floor((now - item.arrival) / aging_s)) * 2)
                + (share and item.prefix_key != prefix)
            )
            << 64
            | (
                abs(item.prompt_tokens - prompt) + abs(item.max_tokens - generate)
                if length_aware
                else 0
            )
        )
        << 32
        | i
        for i, item in enumerate(rest)
    ]
    keys.sort()
    return [key & _INDEX for key in keys]
