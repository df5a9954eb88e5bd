"""Batch selection: FIFO, length-aware and shared-prefix, and the prefix key."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from batcher import Batch, BatchLimits, DynamicBatcher, Pending, prefix_key_of, select
from batcher.formation import effective_priority, length_distance


def item(
    key: str,
    prompt: int,
    gen: int = 16,
    priority: int = 0,
    prefix: bytes | None = None,
    arrival: float = 0.0,
) -> Pending[None]:
    return Pending(
        key=key,
        partition=("t", 0),
        offset=0,
        prompt_tokens=prompt,
        max_tokens=gen,
        arrival=arrival,
        payload=None,
        priority=priority,
        prefix_key=prefix,
    )


def chosen(items: list[Pending[None]]) -> list[str]:
    return [i.key for i in items]


def test_fifo_stops_at_the_first_item_that_does_not_fit() -> None:
    queue = [item("a", 40), item("b", 60), item("c", 4)]
    picked = select(queue, 8, 100, length_aware=False, shared_prefix=False)
    assert chosen(picked) == ["a"]  # c would fit, but it must not overtake b


def test_length_aware_skips_what_does_not_fit_and_fills_with_smaller() -> None:
    queue = [item("a", 40), item("b", 60), item("c", 4)]
    picked = select(queue, 8, 100, length_aware=True, shared_prefix=False)
    assert chosen(picked) == ["a", "c"]


def test_length_aware_groups_similar_lengths_around_the_oldest() -> None:
    queue = [item("anchor", 100), item("short", 10), item("near", 110), item("far", 400)]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=False)
    assert chosen(picked) == ["anchor", "near"]


def test_length_aware_also_matches_generation_budget() -> None:
    queue = [item("anchor", 100, gen=16), item("long-gen", 100, gen=512), item("ok", 120)]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=False)
    assert chosen(picked) == ["anchor", "ok"]


def test_priority_beats_similarity() -> None:
    queue = [item("anchor", 100, priority=1), item("similar", 100), item("urgent", 900, priority=1)]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=True)
    assert chosen(picked) == ["anchor", "urgent"]


def test_shared_prefix_candidates_come_first() -> None:
    queue = [
        item("anchor", 100, prefix=b"p"),
        item("near-other", 100, prefix=b"q"),
        item("far-same", 300, prefix=b"p"),
        item("no-prefix", 100),
    ]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=True)
    assert chosen(picked) == ["anchor", "far-same"]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=False)
    assert chosen(picked) == ["anchor", "near-other"]


def test_anchor_without_prefix_ranks_by_length_only() -> None:
    queue = [item("anchor", 100), item("same-p", 300, prefix=b"p"), item("near", 101)]
    picked = select(queue, 2, 10_000, length_aware=True, shared_prefix=True)
    assert chosen(picked) == ["anchor", "near"]


def test_empty_queue_selects_nothing() -> None:
    assert select([], 4, 100, length_aware=True, shared_prefix=True) == []


def test_prefix_key_hashes_the_first_block_only() -> None:
    base = list(range(32))
    assert prefix_key_of(base[:31]) is None
    key = prefix_key_of(base)
    assert key is not None and len(key) == 16
    assert prefix_key_of([*base, 7, 8, 9]) == key
    assert prefix_key_of([1, *base[1:]]) != key
    assert prefix_key_of([5, 6], block_tokens=2) == prefix_key_of([5, 6, 1], block_tokens=2)
    with pytest.raises(ValueError):
        prefix_key_of(base, block_tokens=0)


queues = st.lists(
    st.tuples(
        st.integers(0, 300),
        st.integers(0, 100),
        st.integers(0, 2),
        st.sampled_from([None, b"p", b"q"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    spec=queues,
    max_size=st.integers(1, 10),
    extra_tokens=st.integers(0, 800),
    length_aware=st.booleans(),
    shared_prefix=st.booleans(),
)
def test_selection_respects_limits_and_keeps_the_anchor(
    spec: list[tuple[int, int, int, bytes | None]],
    max_size: int,
    extra_tokens: int,
    length_aware: bool,
    shared_prefix: bool,
) -> None:
    queue = [
        item(f"r{n}", prompt, gen, priority, prefix, arrival=float(n))
        for n, (prompt, gen, priority, prefix) in enumerate(spec)
    ]
    queue.sort(key=lambda i: (-i.priority, i.arrival))
    max_tokens = queue[0].tokens + extra_tokens
    picked = select(
        queue, max_size, max_tokens, length_aware=length_aware, shared_prefix=shared_prefix
    )
    assert picked[0] is queue[0]
    assert len(picked) <= max_size
    assert sum(i.tokens for i in picked) <= max_tokens
    assert len({i.key for i in picked}) == len(picked)
    left = [i for i in queue if i not in picked]
    if not (length_aware or shared_prefix):
        assert picked == queue[: len(picked)]
    elif len(picked) < max_size:
        # a batch with room left out only items that did not fit the token budget
        budget = max_tokens - sum(i.tokens for i in picked)
        assert all(i.tokens > budget for i in left)
    # priority first: nothing of a lower priority is in while a higher one that fitted is out
    budget_at_end = max_tokens - sum(i.tokens for i in picked)
    for out in left:
        if out.tokens <= budget_at_end and (length_aware or shared_prefix):
            assert all(i.priority >= out.priority for i in picked)


def _padding_waste(limits: BatchLimits, seed: int) -> float:
    """Mean padding waste over batches formed from one mixed queue of 512 requests."""
    rng = random.Random(seed)
    b: DynamicBatcher[None] = DynamicBatcher(limits, dedup=False)
    for n in range(512):
        prompt = min(int(rng.lognormvariate(5.0, 1.0)), 3000)
        gen = rng.choice([64, 128, 256])
        b.add(Pending(f"r{n}", ("t", 0), n, prompt, gen, arrival=n * 1e-4, payload=None), 0.0)
    batches: list[Batch[None]] = []
    while (batch := b.next_batch(1.0, flush=True)) is not None:
        batches.append(batch)
        for i in batch.items:
            b.complete(i.key)
    return sum(x.padding for x in batches) / sum(x.prompt_tokens for x in batches)


def test_length_aware_formation_cuts_padding_on_a_mixed_queue() -> None:
    fifo = BatchLimits(length_aware=False, shared_prefix=False)
    aware = BatchLimits(length_aware=True, shared_prefix=False)
    waste_fifo = _padding_waste(fifo, seed=1)
    waste_aware = _padding_waste(aware, seed=1)
    assert waste_aware < waste_fifo / 4, (waste_fifo, waste_aware)


def _reference(
    queue: list[Pending[None]],
    max_size: int,
    max_tokens: int,
    length_aware: bool,
    shared_prefix: bool,
    now: float,
    aging_s: float,
) -> list[Pending[None]]:
    """The formation as the module documents it, written plainly: a stable sort of the
    candidates by (level, differs from the anchor's prefix, length distance)."""
    anchor, chosen = queue[0], [queue[0]]
    budget = max_tokens - anchor.tokens
    share = shared_prefix and anchor.prefix_key is not None

    def rank(i: Pending[None]) -> tuple[int, int, int]:
        distance = length_distance(anchor, i) if length_aware else 0
        differs = int(share and i.prefix_key != anchor.prefix_key)
        return (-effective_priority(i, now, aging_s), differs, distance)

    for candidate in sorted(queue[1:], key=rank):
        if len(chosen) < max_size and candidate.tokens <= budget:
            chosen.append(candidate)
            budget -= candidate.tokens
    return chosen


@settings(max_examples=200, deadline=None)
@given(
    spec=queues,
    max_size=st.integers(1, 10),
    extra_tokens=st.integers(0, 800),
    length_aware=st.booleans(),
    shared_prefix=st.booleans(),
    aging_s=st.sampled_from([math.inf, 0.5, 3.0]),
)
def test_the_packed_ranking_selects_as_the_documented_one(
    spec: list[tuple[int, int, int, bytes | None]],
    max_size: int,
    extra_tokens: int,
    length_aware: bool,
    shared_prefix: bool,
    aging_s: float,
) -> None:
    queue = [
        item(f"r{n}", prompt, gen, priority, prefix, arrival=float(n) / 4)
        for n, (prompt, gen, priority, prefix) in enumerate(spec)
    ]
    max_tokens = queue[0].tokens + extra_tokens
    now = len(queue) / 4
    assume(length_aware or shared_prefix)  # FIFO has no ranking
    picked = select(
        queue,
        max_size,
        max_tokens,
        length_aware=length_aware,
        shared_prefix=shared_prefix,
        now=now,
        aging_s=aging_s,
    )
    expected = _reference(queue, max_size, max_tokens, length_aware, shared_prefix, now, aging_s)
    assert chosen(picked) == chosen(expected)
