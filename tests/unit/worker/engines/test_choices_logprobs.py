"""n choices and logprobs on the engines that run here (echo, hf), read with the SDK."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from tests.openai_sdk import ChatCompletion, Completion, sdk_line
from tests.unit.conftest import resolved
from worker.engines.base import Completion as EngineCompletion
from worker.engines.base import EngineInput, StaticEngine
from worker.engines.echo import UNLIKELY, EchoEngine
from worker.engines.hf.engine import HFEngine
from worker.loop.jobs import Identity, Job, Source, completed
from worker.wire.answers import format_output_line
from worker.wire.messages import ChatMessage, Endpoint, InferenceRequest

#: two sampled choices with the chosen tokens' and three alternatives' log probabilities
TWO_CHOICES_WITH_LOGPROBS: dict[str, Any] = {
    "n": 2,
    "logprobs": True,
    "top_logprobs": 3,
    "temperature": 0.9,
    "seed": 5,
}


def ask(engine: StaticEngine, key: str, text: str, **sampling: Any) -> EngineInput:
    request = InferenceRequest(custom_id=key, messages=(ChatMessage("user", text),))
    params = resolved(**{"max_tokens": 10, "temperature": 0.0, **sampling})
    return EngineInput(key, engine.encode(request), params)


def run(engine: StaticEngine, *inputs: EngineInput) -> dict[str, EngineCompletion]:
    done: list[EngineCompletion] = []
    engine.run_batch(inputs, done.append)
    assert sorted(c.key for c in done) == sorted(i.key for i in inputs)
    return {c.key: c for c in done}


def as_line(item: EngineInput, completion: EngineCompletion, endpoint: Endpoint) -> Any:
    """The output line a user gets for ``completion``, read with the openai SDK."""
    request = (
        InferenceRequest(item.key, messages=(ChatMessage("user", "x"),))
        if endpoint == "chat"
        else InferenceRequest(item.key, prompt="x")
    )
    job = Job(request, item, Source("t", 0, 0), 0.0, 0.0)
    result = completed(
        job,
        completion,
        identity=Identity("w", "m"),
        batch_size=1,
        dispatched_at=0.0,
        finished_at=0.0,
    )
    return sdk_line(format_output_line(result))


def test_echo_answers_n_identical_choices_with_certain_logprobs() -> None:
    engine = EchoEngine()
    item = ask(engine, "e", "héllo", n=3, logprobs=True, top_logprobs=2)
    done = run(engine, item)["e"]
    texts = [done.text, *(c.text for c in done.extra_choices)]
    assert texts == ["héllo"] * 3
    assert done.completion_tokens == 3 * len("héllo".encode())
    assert done.logprobs is not None and len(done.logprobs) == len("héllo".encode())
    first = done.logprobs[0]
    assert (first.token, first.logprob) == ("h", 0.0)
    assert [(t.token, t.logprob) for t in first.top] == [("h", 0.0), ("i", UNLIKELY)]
    body = as_line(item, done, "chat")
    assert isinstance(body, ChatCompletion) and [c.index for c in body.choices] == [0, 1, 2]
    assert body.choices[2].logprobs is not None
    assert body.choices[2].logprobs.content is not None
    assert body.choices[2].logprobs.content[0].bytes == [ord("h")]


def test_hf_choices_are_the_seeded_runs_of_seed_plus_i(tiny_hf_engine: HFEngine) -> None:
    sampled = {"temperature": 1.0, "seed": 11, "max_tokens": 8}
    item = ask(tiny_hf_engine, "n", "write a short poem", n=3, **sampled)
    alone = {
        i: ask(tiny_hf_engine, f"s{i}", "write a short poem", **{**sampled, "seed": 11 + i})
        for i in range(3)
    }
    done = run(tiny_hf_engine, item, *alone.values())
    merged = done["n"]
    choices = [
        (merged.text, merged.finish_reason),
        *((c.text, c.finish_reason) for c in merged.extra_choices),
    ]
    assert choices == [(done[f"s{i}"].text, done[f"s{i}"].finish_reason) for i in range(3)]
    assert merged.completion_tokens == sum(done[f"s{i}"].completion_tokens for i in range(3))
    assert len(set(choices)) > 1  # three seeds, not one answer copied


def test_hf_logprobs_are_the_models_own(tiny_hf_engine: HFEngine) -> None:
    item = ask(tiny_hf_engine, "g", "what is two plus", logprobs=True, top_logprobs=3)
    done = run(tiny_hf_engine, item)["g"]
    assert done.logprobs is not None
    eos = 1 if done.finish_reason == "stop" else 0
    assert len(done.logprobs) == done.completion_tokens - eos
    for token in done.logprobs:
        assert token.logprob <= 0 and len(token.top) == 3
        values = [t.logprob for t in token.top]
        assert values == sorted(values, reverse=True) and sum(map(math.exp, values)) <= 1 + 1e-6
        # greedy decoding picks the likeliest token: the first alternative, same value
        assert (token.top[0].token, token.top[0].logprob) == (token.token, token.logprob)
    none = run(tiny_hf_engine, replace(item, sampling=resolved(max_tokens=10)))["g"]
    assert none.logprobs is None and none.text == done.text


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_hf_n_and_logprobs_read_as_sdk_types(tiny_hf_engine: HFEngine, endpoint: Endpoint) -> None:
    item = ask(
        tiny_hf_engine,
        "k",
        "hello world",
        n=2,
        logprobs=True,
        top_logprobs=2,
        seed=3,
        temperature=0.8,
    )
    body = as_line(item, run(tiny_hf_engine, item)["k"], endpoint)
    assert isinstance(body, ChatCompletion if endpoint == "chat" else Completion)
    assert len(body.choices) == 2
    for choice in body.choices:
        assert choice.logprobs is not None


@pytest.mark.model
def test_smollm2_n_choices_with_logprobs(hf_engine: HFEngine) -> None:
    item = ask(hf_engine, "m", "Name a colour.", max_tokens=12, **TWO_CHOICES_WITH_LOGPROBS)
    done = run(hf_engine, item)["m"]
    body = as_line(item, done, "chat")
    assert isinstance(body, ChatCompletion) and len(body.choices) == 2
    for choice in body.choices:
        assert choice.message.content and choice.logprobs and choice.logprobs.content
        assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in choice.logprobs.content)
        if choice.message.content.isascii():  # byte-level BPE: the tokens spell the text
            assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    assert body.usage is not None and body.usage.completion_tokens == done.completion_tokens
