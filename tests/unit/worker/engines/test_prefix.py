"""The hf engine's shared-prefix KV cache: same greedy output as running every row in full,
the prefix computed once per LRU entry, and the cases that must not use it.

Most tests drive a tiny random-weight Llama; the ``model``-marked one runs SmolLM2.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from tests.unit.conftest import resolved, tiny_llama
from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Completion, EngineInput
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.prefix_cache import (
    PrefixCache,
    cacheable_prefix_length,
    common_prefix_length,
)
from worker.wire.messages import ChatMessage, InferenceRequest

VOCAB = 96
rng = random.Random(5)
SYSTEM = tuple(rng.randrange(8, VOCAB) for _ in range(70))  # clear of the special tokens


def tokens(n: int, seed: int) -> tuple[int, ...]:
    r = random.Random(seed)
    return tuple(r.randrange(8, VOCAB) for _ in range(n))


def request(key: str, ids: Sequence[int], max_tokens: int = 12, **sampling: Any) -> EngineInput:
    params = resolved(**{"max_tokens": max_tokens, "temperature": 0.0, **sampling})
    return EngineInput(key, tuple(ids), params)


def run(engine: HFEngine, inputs: Sequence[EngineInput]) -> dict[str, tuple[str, int, str]]:
    done: list[Completion] = []
    engine.run_batch(inputs, done.append)
    assert sorted(c.key for c in done) == sorted(i.key for i in inputs)
    return {c.key: (c.text, c.completion_tokens, c.finish_reason) for c in done}


def engines(model: Any = None, tokenizer: Any = None) -> tuple[HFEngine, HFEngine]:
    """The same model behind two engines: prefix cache on, and off."""
    if model is None:
        model, tokenizer = tiny_llama(VOCAB)
    pair = []
    for shared in (True, False):
        engine = HFEngine(
            EngineConfig(model="tiny", device="cpu"),
            batching=BatchingConfig(shared_prefix=shared),
            preloaded=(model, tokenizer),
        )
        engine.load()
        pair.append(engine)
    return pair[0], pair[1]


def batch(suffixes: Sequence[int], seed: int) -> list[EngineInput]:
    """Rows sharing SYSTEM, with suffixes of the given lengths and different max_tokens."""
    return [
        request(f"r{i}", SYSTEM + tokens(n, seed + i), max_tokens=6 + 3 * i)
        for i, n in enumerate(suffixes)
    ]


def test_prefix_lengths_are_shared_whole_blocks_that_leave_a_token_to_run() -> None:
    assert common_prefix_length([]) == 0
    assert common_prefix_length([(1, 2, 3), (1, 2, 4), (1, 2)]) == 2
    assert common_prefix_length([(5, 6)]) == 2
    head = tuple(range(70))
    assert cacheable_prefix_length([(*head, 1), (*head, 2, 3)]) == 64
    assert cacheable_prefix_length([head[:64], (*head, 2)]) == 32  # one token of each runs
    assert cacheable_prefix_length([(*head[:31], 0), head]) == 0
    assert cacheable_prefix_length([(*head, 1), (*head, 2)], block_tokens=5) == 70
    assert cacheable_prefix_length([]) == 0


def test_a_shared_prefix_gives_the_same_text_as_running_every_row_in_full() -> None:
    on, off = engines()
    assert on.prefixes is not None and off.prefixes is None
    # suffixes from 1 token (the prompt is the cached prefix plus one) to 40
    first = batch([1, 17, 40, 9, 3], seed=1)
    assert run(on, first) == run(off, first)
    assert (on.prefixes.misses, on.prefixes.hits, len(on.prefixes)) == (1, 0, 1)
    assert on.prefixes.positions_saved == 5 * 64 - 64
    # the next batch with the same system prompt skips even the prefix's forward pass
    second = batch([25, 2, 11], seed=50)
    assert run(on, second) == run(off, second)
    assert (on.prefixes.misses, on.prefixes.hits) == (1, 1)
    assert on.prefixes.positions_saved == 5 * 64 - 64 + 3 * 64


def test_sampled_and_penalised_rows_are_unchanged_by_the_prefix_cache() -> None:
    on, off = engines()
    inputs = [
        request("seeded", SYSTEM + tokens(5, 1), 16, temperature=0.9, seed=3, top_p=0.9),
        request("presence", SYSTEM + tokens(12, 2), 16, presence_penalty=1.5),
        request("frequency", SYSTEM + tokens(30, 3), 16, frequency_penalty=0.7),
        request("plain", SYSTEM + tokens(8, 4), 16),
    ]
    assert run(on, inputs) == run(off, inputs)
    assert on.prefixes is not None and on.prefixes.misses == 1


def test_repetition_penalty_batches_run_in_full() -> None:
    on, off = engines()
    inputs = [
        request("rep", SYSTEM + tokens(5, 1), 12, repetition_penalty=3.0),
        request("plain", SYSTEM + tokens(9, 2), 12),
    ]
    assert run(on, inputs) == run(off, inputs)
    assert on.prefixes is not None and (on.prefixes.misses, on.prefixes.hits) == (0, 0)


def test_rows_outside_the_group_share_the_batch_and_keep_their_text() -> None:
    on, off = engines()
    inputs = [
        *batch([1, 30, 6], seed=3),
        request("one-token", (40,)),  # region A all padding
        request("short", tokens(20, 7)),  # shorter than the prefix
        request("long", tokens(120, 8), max_tokens=20),  # the longest row is not in the group
        request("near", SYSTEM[:40] + tokens(40, 9)),  # first block shared, not 64 tokens
    ]
    assert run(on, inputs) == run(off, inputs)
    assert on.prefixes is not None and on.prefixes.misses == 1


def test_the_layout_gives_every_row_the_logits_it_has_alone() -> None:
    model, _ = tiny_llama(VOCAB)
    cache = PrefixCache(model)
    prompts = [(*SYSTEM, *tokens(9, 1)), (*SYSTEM, 5), tokens(20, 2), tokens(90, 3), (7,)]
    plan = cache.plan(prompts)
    assert plan is not None and plan.others == (2, 3, 4)

    def stage(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.tensor([[1] * (width - len(r)) + list(r) for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        return ids, mask

    ids, mask, kv = cache.inputs(plan, prompts, stage, pad=1)
    assert ids.shape == (5, 90) and kv.get_seq_length() == 64  # as wide as the longest
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(
            input_ids=ids[:, 64:],
            attention_mask=mask,
            position_ids=positions[:, 64:],
            past_key_values=kv,
        ).logits[:, -1]
        for i, prompt in enumerate(prompts):
            alone = model(input_ids=torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(out[i], alone, rtol=1e-4, atol=1e-5)


def test_the_group_saving_the_most_positions_is_served() -> None:
    model, _ = tiny_llama(VOCAB)
    cache = PrefixCache(model)
    other = tokens(100, 11)
    prompts = [(*SYSTEM, 1), (*SYSTEM, 2), (*other, 1), (*other, 2), tokens(50, 3)]
    plan = cache.plan(prompts)
    assert plan is not None
    assert (plan.entry.tokens, plan.group, plan.others) == (other[:96], (2, 3), (0, 1, 4))
    assert plan.saved_positions == 2 * 96
    assert cache.plan([tokens(40, 1), tokens(40, 2)]) is None  # nothing shared


def test_a_single_request_uses_a_cached_prefix_but_never_computes_one() -> None:
    on, off = engines()
    assert on.prefixes is not None
    alone = [request("a", (*SYSTEM, *tokens(7, 9)), 10)]
    assert run(on, alone) == run(off, alone)
    assert (on.prefixes.misses, on.prefixes.hits, len(on.prefixes)) == (0, 0, 0)
    run(on, batch([3, 4], seed=2))
    assert run(on, alone) == run(off, alone)
    assert (on.prefixes.misses, on.prefixes.hits) == (1, 1)


def test_batches_without_a_whole_shared_block_run_in_full() -> None:
    on, off = engines()
    inputs = [request("a", SYSTEM + tokens(5, 1)), request("b", SYSTEM[:31] + tokens(50, 2))]
    assert run(on, inputs) == run(off, inputs)
    assert on.prefixes is not None and len(on.prefixes) == 0


def test_generation_never_writes_to_a_cached_prefix() -> None:
    on, _ = engines()
    assert on.prefixes is not None
    run(on, batch([4, 6], seed=1))
    plan = on.prefixes.plan([(*SYSTEM, 1), (*SYSTEM, 2)])
    assert plan is not None and plan.entry.tokens == SYSTEM[:64]
    before = [(k.clone(), v.clone()) for k, v in plan.entry.layers]
    run(on, [*batch([8, 1, 5], seed=9), request("x", tokens(30, 4))])
    for (k, v), (k0, v0) in zip(plan.entry.layers, before, strict=True):
        assert k.shape[0] == 1 and torch.equal(k, k0) and torch.equal(v, v0)


def test_the_lru_keeps_the_most_recent_prefixes() -> None:
    model, _ = tiny_llama(VOCAB)
    cache = PrefixCache(model, capacity=2)
    a, b, c = (tokens(40, seed) for seed in (1, 2, 3))
    for head in (a, b, a, c):  # a is used again before c arrives: b is the oldest
        cache.plan([(*head, 1), (*head, 2)])
    assert (cache.misses, cache.hits, len(cache)) == (3, 1, 2)
    assert cache.plan([(*a, 5)]) is not None  # a lone row finds a cached prefix...
    assert cache.plan([(*b, 5)]) is None  # ...but does not compute an evicted one
    assert (cache.misses, cache.hits) == (3, 2)
    with pytest.raises(ValueError):
        PrefixCache(model, capacity=0)


@pytest.mark.model
def test_smollm2_gives_the_same_text_with_and_without_the_prefix_cache(
    hf_engine: HFEngine,
) -> None:
    on = hf_engine
    _, off = engines(on.model, on.encoder.tokenizer)
    system = (
        "You are the help desk of a public library. Answer questions about opening hours, "
        "borrowing rules, late fees, printing, rooms and events for children and adults. "
        "Keep every answer short, friendly and factual. When you do not know something, say "
        "so plainly and suggest asking a librarian at the front desk; never invent dates, "
        "prices or names."
    )
    users = (
        "When do you open on Sunday?",
        "How many books can I borrow at once, and for how long may I keep them?",
        "hi",
        "Do you run reading groups for children in the summer holidays? How do I sign up?",
        "Can I print documents here?",
    )
    chats: list[tuple[ChatMessage, ...]] = [
        (ChatMessage("system", system), ChatMessage("user", text)) for text in users
    ]
    # and two rows outside the group: the model's default system prompt, short and long
    chats += [(ChatMessage("user", "Name three colours."),), (ChatMessage("user", system),)]
    inputs = [
        EngineInput(
            str(i),
            on.encode(InferenceRequest(custom_id=str(i), messages=chat)),
            resolved(max_tokens=24 + 4 * i, temperature=0.0),
        )
        for i, chat in enumerate(chats)
    ]
    shared = cacheable_prefix_length([i.prompt_token_ids for i in inputs[: len(users)]])
    assert shared >= 64, shared
    assert on.prefixes is not None
    plan = on.prefixes.plan([i.prompt_token_ids for i in inputs])
    assert plan is not None and plan.group == tuple(range(len(users)))
    assert plan.entry.length == shared
    with_cache = run(on, inputs)
    assert with_cache == run(off, inputs)
