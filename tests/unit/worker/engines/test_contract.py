"""The invariants of worker/engines/base.py, checked on every engine.

echo, a tiny random-weight Llama through the hf engine and the trtllm engine on the
stand-in ``tensorrt_llm`` (``fake_trtllm``) always run; SmolLM2 through the hf engine runs
under ``-m model``; the real TensorRT-LLM only where it is installed (an NVIDIA GPU) and
BATCHPIPE_TRTLLM_MODEL names a local Hugging Face checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator, Sequence

import pytest

from tests.unit.conftest import resolved
from worker.config import EngineConfig
from worker.engines.base import Completion, Engine, EngineInput, InFlightEngine, StaticEngine
from worker.engines.echo import EchoEngine
from worker.errors import RequestError
from worker.wire.messages import ChatMessage, InferenceRequest

TRTLLM_SKIP = "tensorrt_llm not installed (needs an NVIDIA GPU); not run on this machine"
QUESTIONS = (
    "what is two plus two",
    "name a color",
    "write a short poem about the sea",
    "who wrote hamlet",
)

ENGINES = [
    pytest.param("echo", id="echo"),
    pytest.param("hf-tiny", id="hf-tiny"),
    pytest.param("hf", id="hf-smollm2", marks=pytest.mark.model),
    pytest.param("trtllm-fake", id="trtllm-fake"),
    pytest.param(
        "trtllm",
        id="trtllm",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("tensorrt_llm") is None, reason=TRTLLM_SKIP
        ),
    ),
]


@pytest.fixture(scope="module")
def trtllm_engine() -> Iterator[Engine]:
    from worker.engines.trtllm import TrtLlmEngine

    model = os.environ.get("BATCHPIPE_TRTLLM_MODEL")
    if not model:
        pytest.skip("set BATCHPIPE_TRTLLM_MODEL to a local Hugging Face model directory")
    engine = TrtLlmEngine(EngineConfig(kind="trtllm", model=model))
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    name = request.param
    if name == "echo":
        return EchoEngine()
    if name == "trtllm-fake":
        fake: Engine = request.getfixturevalue("fake_trtllm")[0]
        return fake
    fixture = {"hf-tiny": "tiny_hf_engine", "hf": "hf_engine", "trtllm": "trtllm_engine"}[name]
    loaded: Engine = request.getfixturevalue(fixture)
    return loaded


def chat(engine: Engine, key: str, question: str, **sampling: object) -> EngineInput:
    request = InferenceRequest(custom_id=key, messages=(ChatMessage("user", question),))
    params = resolved(**{"max_tokens": 16, "temperature": 0.0, **sampling})
    return EngineInput(key, engine.encode(request), params)


def run(engine: Engine, inputs: Sequence[EngineInput]) -> dict[str, Completion]:
    """Each input's completion; a static engine runs them as one batch, an in-flight
    engine gets them all submitted and is read until every one has completed."""
    seen: list[Completion] = []
    if isinstance(engine, StaticEngine):
        engine.run_batch(inputs, seen.append)
    else:
        assert isinstance(engine, InFlightEngine)
        for item in inputs:
            engine.submit(item)
        deadline = time.monotonic() + 60
        while len(seen) < len(inputs) and time.monotonic() < deadline:
            seen += engine.completions(timeout_s=0.5)
    keys = [c.key for c in seen]
    assert sorted(keys) == sorted(i.key for i in inputs), "one completion per input"
    return {c.key: c for c in seen}


def test_every_input_completes_exactly_once_before_run_batch_returns(engine: Engine) -> None:
    inputs = [chat(engine, f"k{i}", q) for i, q in enumerate(QUESTIONS)]
    done = run(engine, inputs)
    assert all(c.error is None for c in done.values())


def test_usage_counts_prompt_ids_and_generated_tokens(engine: Engine) -> None:
    inputs = [chat(engine, f"k{i}", q, max_tokens=8 + i) for i, q in enumerate(QUESTIONS)]
    done = run(engine, inputs)
    for item in inputs:
        c = done[item.key]
        assert c.prompt_tokens == len(item.prompt_token_ids)
        assert 0 <= c.completion_tokens <= item.sampling.max_tokens
        if c.finish_reason == "length":
            assert c.completion_tokens == item.sampling.max_tokens


def test_greedy_text_is_the_same_alone_and_in_a_batch(engine: Engine) -> None:
    inputs = [chat(engine, f"k{i}", q) for i, q in enumerate(QUESTIONS)]
    batched = run(engine, inputs)
    for item in inputs:
        alone = run(engine, [item])[item.key]
        assert alone.text == batched[item.key].text
        assert alone.completion_tokens == batched[item.key].completion_tokens


def test_max_tokens_truncates_with_finish_reason_length(engine: Engine) -> None:
    item = chat(engine, "k", QUESTIONS[2], max_tokens=3)
    done = run(engine, [item])["k"]
    assert (done.finish_reason, done.completion_tokens) == ("length", 3)


def test_stop_string_ends_the_text_before_it(engine: Engine) -> None:
    full = run(engine, [chat(engine, "k", QUESTIONS[2])])["k"]
    words = full.text.split()
    assert len(words) >= 2, f"need a longer answer to pick a stop string from: {full.text!r}"
    stop = words[1]
    stopped = run(engine, [chat(engine, "k", QUESTIONS[2], stop=(stop,))])["k"]
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.find(stop)]
    assert stop not in stopped.text
    assert stopped.completion_tokens <= full.completion_tokens


def test_encode_takes_prompt_token_ids_as_given_and_rejects_empty_prompts(engine: Engine) -> None:
    ids = chat(engine, "k", QUESTIONS[0]).prompt_token_ids
    assert engine.encode(InferenceRequest(custom_id="k", prompt_token_ids=ids)) == ids
    assert engine.encode(InferenceRequest(custom_id="k", prompt="hello world"))
    with pytest.raises(RequestError) as caught:
        engine.encode(InferenceRequest(custom_id="k", prompt=""))
    assert caught.value.code == 4002


def test_utilization_is_a_fraction(engine: Engine) -> None:
    run(engine, [chat(engine, "k", QUESTIONS[0])])
    assert 0.0 <= engine.utilization() <= 1.0
    assert isinstance(engine.model_name, str) and engine.model_name
