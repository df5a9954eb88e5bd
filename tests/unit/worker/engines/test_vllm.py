"""The vllm engine on SmolLM2 (CPU) beyond the contract's invariants (test_contract.py):
seeds, its limits, capacity, abort, the GGUF converted once for it, and the request
fields it maps onto vLLM: response_format (structured outputs), n and logprobs.

The engine loads once per session (``vllm_engine`` in tests/unit/conftest.py).
"""

from __future__ import annotations

import time

import pytest

from tests.openai_sdk import ChatCompletion
from tests.openai_sdk import Completion as SDKCompletion
from tests.unit.conftest import VLLM_TEST_BATCHING, resolved
from tests.unit.worker.engines.test_choices_logprobs import TWO_CHOICES_WITH_LOGPROBS, as_line
from tests.unit.worker.engines.test_structured import SCHEMAS, assert_follow_their_schemas, fmt
from worker.config import EngineConfig
from worker.engines.base import Capacity, Completion, EngineInput
from worker.engines.convert import hf_directory
from worker.engines.models import locate_model
from worker.engines.vllm.engine import VllmEngine
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import (
    ChatMessage,
    Choice,
    Endpoint,
    InferenceRequest,
    ResponseFormat,
    SamplingParams,
)

pytestmark = pytest.mark.model

#: the longest the engine may take to answer what one test submits (a bound, not a pace)
WAIT_S = 600.0
FULL = Capacity(VLLM_TEST_BATCHING.max_batch_size, VLLM_TEST_BATCHING.max_batch_tokens)


def chat(engine: VllmEngine, key: str, question: str, **sampling: object) -> EngineInput:
    request = InferenceRequest(custom_id=key, messages=(ChatMessage("user", question),))
    params = resolved(**{"max_tokens": 12, "temperature": 0.0, **sampling})
    return EngineInput(key, engine.encode(request), params)


def collect(engine: VllmEngine, keys: set[str]) -> dict[str, Completion]:
    """Completions until each of ``keys`` has one (every completion seen is returned)."""
    seen: list[Completion] = []
    deadline = time.monotonic() + WAIT_S
    while not keys <= {c.key for c in seen}:
        assert time.monotonic() < deadline, f"no completion for {keys - {c.key for c in seen}}"
        seen.extend(engine.completions(timeout_s=0.5))
    by_key = {c.key: c for c in seen}
    assert len(by_key) == len(seen), "a key completed twice"
    return by_key


def test_a_seeded_sample_is_the_same_alone_and_in_flight(vllm_engine: VllmEngine) -> None:
    poem = chat(vllm_engine, "poem", "write a short poem about the sea", temperature=1.0, seed=7)
    vllm_engine.submit(poem)
    alone = collect(vllm_engine, {"poem"})["poem"]
    other = chat(vllm_engine, "other", "name a color", temperature=1.0, seed=8)
    vllm_engine.submit(other)
    vllm_engine.submit(poem)
    again = collect(vllm_engine, {"poem", "other"})["poem"]
    assert alone.text and again.text == alone.text
    assert again.completion_tokens == alone.completion_tokens


def test_a_prompt_over_the_model_length_fails_alone_with_4003(vllm_engine: VllmEngine) -> None:
    fits = chat(vllm_engine, "fits", "who wrote hamlet")
    ids = fits.prompt_token_ids * (vllm_engine.max_model_len // len(fits.prompt_token_ids) + 1)
    too_long = EngineInput("long", ids, resolved(max_tokens=4, temperature=0.0))
    vllm_engine.submit(too_long)
    vllm_engine.submit(fits)
    done = collect(vllm_engine, {"long", "fits"})
    assert done["fits"].error is None and done["fits"].text
    failed = done["long"]
    assert failed.error is not None and failed.error.code == 4003
    assert (failed.finish_reason, failed.prompt_tokens) == ("error", len(ids))


def test_max_tokens_zero_completes_with_nothing_generated(vllm_engine: VllmEngine) -> None:
    item = chat(vllm_engine, "zero", "name a color", max_tokens=0)
    vllm_engine.submit(item)
    done = collect(vllm_engine, {"zero"})["zero"]
    assert (done.text, done.completion_tokens, done.finish_reason) == ("", 0, "length")


def test_capacity_counts_sequences_and_prompt_plus_max_tokens(vllm_engine: VllmEngine) -> None:
    assert vllm_engine.capacity() == FULL
    item = chat(vllm_engine, "k", "name a color", max_tokens=10)
    vllm_engine.submit(item)
    budget = len(item.prompt_token_ids) + 10
    assert vllm_engine.capacity() == Capacity(FULL.sequences - 1, FULL.tokens - budget)
    collect(vllm_engine, {"k"})
    assert vllm_engine.capacity() == FULL


def test_an_aborted_request_is_never_completed(vllm_engine: VllmEngine) -> None:
    long = chat(vllm_engine, "long", "write a short poem about the sea", max_tokens=200)
    short = chat(vllm_engine, "short", "name a color")
    dropped = vllm_engine.finished_after_abort
    vllm_engine.submit(long)
    vllm_engine.submit(short)
    vllm_engine.abort(["long"])
    assert vllm_engine.capacity().sequences == FULL.sequences - 1
    seen = collect(vllm_engine, {"short"})
    # an unknown key and a finished one: nothing happens
    vllm_engine.abort(["unknown", "short"])
    vllm_engine.submit(chat(vllm_engine, "after", "who wrote hamlet"))
    seen |= collect(vllm_engine, {"after"})
    # had vLLM kept running it, it would finish before vLLM goes idle, and count here
    assert vllm_engine.wait_idle(WAIT_S)
    seen |= {c.key: c for c in vllm_engine.completions()}
    assert "long" not in seen
    assert vllm_engine.finished_after_abort == dropped
    assert vllm_engine.capacity() == FULL


def test_the_gguf_is_converted_once_into_a_model_directory(vllm_engine: VllmEngine) -> None:
    cache = EngineConfig().model_cache_dir
    directory = hf_directory(locate_model(EngineConfig().model), cache)
    written = (directory / "config.json").stat().st_mtime_ns
    assert hf_directory(locate_model(EngineConfig().model), cache) == directory
    assert (directory / "config.json").stat().st_mtime_ns == written
    assert {"model.safetensors", "tokenizer.json"} <= {p.name for p in directory.iterdir()}


def structured(engine: VllmEngine, key: str, response_format: ResponseFormat) -> EngineInput:
    request = InferenceRequest(
        custom_id=key,
        messages=(ChatMessage("user", "Describe it as JSON."),),
        sampling=SamplingParams(response_format=response_format),
    )
    params = resolved(max_tokens=120, temperature=0.0, response_format=response_format)
    return EngineInput(key, engine.encode(request), params)


def test_answers_follow_their_json_schema(vllm_engine: VllmEngine) -> None:
    inputs = [structured(vllm_engine, f"k{i}", fmt(s)) for i, s in enumerate(SCHEMAS)]
    inputs.append(structured(vllm_engine, "obj", ResponseFormat("json_object")))
    inputs.append(chat(vllm_engine, "free", "name a color"))
    for item in inputs:
        vllm_engine.submit(item)
    done = collect(vllm_engine, {item.key for item in inputs})
    assert_follow_their_schemas(done)
    assert not done["free"].text.startswith("{")  # free text is left alone


def test_a_schema_vllm_cannot_compile_is_refused_at_admission(vllm_engine: VllmEngine) -> None:
    with pytest.raises(RequestError) as info:
        structured(vllm_engine, "bad", fmt({"type": "integer", "minimum": 5, "maximum": 1}))
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")
    assert "schema" in info.value.message


def test_n_choices_are_the_runs_seeded_seed_plus_i(vllm_engine: VllmEngine) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 8}
    both = chat(vllm_engine, "n", "write a short poem", n=2, seed=21, **sampled)
    second = chat(vllm_engine, "s1", "write a short poem", seed=22, **sampled)
    vllm_engine.submit(both)
    vllm_engine.submit(second)
    done = collect(vllm_engine, {"n", "s1"})
    merged = done["n"]
    assert merged.error is None and len(merged.extra_choices) == 1
    assert merged.extra_choices[0].text == done["s1"].text
    assert merged.completion_tokens > done["s1"].completion_tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_logprobs_read_as_the_sdks_types(vllm_engine: VllmEngine, endpoint: Endpoint) -> None:
    item = chat(vllm_engine, "lp", "Name a colour.", **TWO_CHOICES_WITH_LOGPROBS)
    vllm_engine.submit(item)
    done = collect(vllm_engine, {"lp"})["lp"]
    body = as_line(item, done, endpoint)
    assert isinstance(body, ChatCompletion if endpoint == "chat" else SDKCompletion)
    assert len(body.choices) == 2
    if isinstance(body, ChatCompletion):
        assert all(c.logprobs and len(c.logprobs.content or ()) for c in body.choices)
    for ours in (Choice(done.text, done.finish_reason, done.logprobs), *done.extra_choices):
        assert ours.logprobs is not None
        for token in ours.logprobs:
            values = [t.logprob for t in token.top]
            assert token.logprob <= 0 and len(values) == 3 and values == sorted(values)[::-1]
            assert token.logprob <= values[0]
        if ours.text.isascii():  # byte-level BPE: the tokens spell the text
            assert "".join(t.token for t in ours.logprobs) == ours.text
