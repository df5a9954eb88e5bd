"""The echo engine, and the engine factory's lazy imports."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.unit.conftest import resolved
from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Completion, Engine, EngineBroken, EngineInput
from worker.engines.echo import EchoEngine, reply_text
from worker.engines.echo_inflight import EchoInFlightEngine
from worker.engines.factory import create_engine
from worker.errors import RequestError
from worker.wire.messages import ChatMessage, InferenceRequest


def ask(engine: Engine, *messages: tuple[str, str]) -> tuple[int, ...]:
    chat = tuple(ChatMessage(role, content) for role, content in messages)
    return engine.encode(InferenceRequest(custom_id="c", messages=chat))


def answer(engine: EchoEngine, ids: tuple[int, ...], **sampling: object) -> Completion:
    done: list[Completion] = []
    engine.run_batch(
        [EngineInput("k", ids, resolved(**{"max_tokens": 100, **sampling}))], done.append
    )
    (completion,) = done
    return completion


def test_chat_renders_role_lines_as_utf8_bytes() -> None:
    ids = ask(EchoEngine(), ("system", "be brief"), ("user", "héllo"))
    assert bytes(ids).decode() == "system: be brief\nuser: héllo\n"


def test_reply_is_the_last_user_message() -> None:
    engine = EchoEngine()
    ids = ask(engine, ("user", "first"), ("assistant", "ok"), ("user", "two\nlines"))
    done = answer(engine, ids)
    assert (done.text, done.finish_reason) == ("two\nlines", "stop")
    assert done.completion_tokens == len(b"two\nlines")
    assert done.prompt_tokens == len(ids)


def test_reply_stops_before_a_following_message_and_echoes_plain_prompts() -> None:
    assert reply_text("user: hi\nassistant: hello\n") == "hi"
    assert reply_text("just a prompt") == "just a prompt"


def test_max_tokens_truncates_by_bytes() -> None:
    engine = EchoEngine()
    done = answer(engine, ask(engine, ("user", "abcdef")), max_tokens=4)
    assert (done.text, done.finish_reason, done.completion_tokens) == ("abcd", "length", 4)


def test_stop_string_counts_its_tokens_but_is_not_in_the_text() -> None:
    engine = EchoEngine()
    ids = ask(engine, ("user", "one, two. three"))
    done = answer(engine, ids, stop=(".", ","))
    assert (done.text, done.finish_reason, done.completion_tokens) == ("one", "stop", 4)
    # a stop string that would only complete past max_tokens does not stop it
    late = answer(engine, ids, stop=("three",), max_tokens=8)
    assert (late.text, late.finish_reason) == ("one, two", "length")


def test_prompt_and_token_ids_input() -> None:
    engine = EchoEngine()
    assert engine.encode(InferenceRequest(custom_id="p", prompt="ab")) == (97, 98)
    assert engine.encode(InferenceRequest(custom_id="t", prompt_token_ids=(1, 2))) == (1, 2)
    with pytest.raises(RequestError) as caught:
        engine.encode(InferenceRequest(custom_id="t", prompt_token_ids=(300,)))
    assert (caught.value.code, caught.value.custom_id) == (4002, "t")


def test_slow_engine_completes_short_answers_first_and_reports_busy_time() -> None:
    engine = EchoEngine(delay_per_batch_s=0.02, delay_per_token_s=0.01)
    engine.utilization()
    long = EngineInput("long", ask(engine, ("user", "x" * 10)), resolved(max_tokens=50))
    short = EngineInput("short", ask(engine, ("user", "x")), resolved(max_tokens=50))
    arrivals: list[tuple[str, float]] = []
    start = time.monotonic()
    engine.run_batch([long, short], lambda c: arrivals.append((c.key, time.monotonic() - start)))
    assert [key for key, _ in arrivals] == ["short", "long"]
    assert arrivals[0][1] >= 0.03 and arrivals[1][1] >= 0.12
    assert engine.utilization() > 0.5
    time.sleep(0.05)
    assert engine.utilization() < 0.5


def test_a_static_batch_pays_for_every_row_until_its_longest_ends() -> None:
    # 4 rows, 10 steps for the longest: each step costs 0.001 + 4 × 0.002 s
    engine = EchoEngine(delay_per_token_s=0.001, delay_per_seq_token_s=0.002)
    inputs = [
        EngineInput(f"k{n}", ask(engine, ("user", "x" * n)), resolved(max_tokens=50))
        for n in (1, 2, 3, 10)
    ]
    start = time.monotonic()
    engine.run_batch(inputs, lambda c: None)
    assert time.monotonic() - start >= 10 * (0.001 + 4 * 0.002)


def test_in_flight_echo_retires_short_answers_while_long_ones_run() -> None:
    engine = EchoInFlightEngine(delay_per_token_s=0.001, max_sequences=4, max_tokens=200)
    engine.load()
    try:
        long = EngineInput("long", ask(engine, ("user", "x" * 40)), resolved(max_tokens=50))
        short = EngineInput("short", ask(engine, ("user", "x")), resolved(max_tokens=50))
        engine.submit(long)
        engine.submit(short)
        assert engine.capacity().sequences == 2
        assert engine.capacity().tokens == 200 - 2 * 50 - len(long.prompt_token_ids) - len(
            short.prompt_token_ids
        )
        order: list[str] = []
        while len(order) < 2:
            order += [c.key for c in engine.completions(timeout_s=1.0)]
        assert order == ["short", "long"]
        assert engine.capacity().sequences == 4 and engine.capacity().tokens == 200
        assert 0.0 < engine.utilization() <= 1.0
    finally:
        engine.close()
    with pytest.raises(EngineBroken):
        engine.submit(long)


def test_factory_builds_each_kind_without_loading_anything() -> None:
    batching = BatchingConfig()
    echo = create_engine(EngineConfig(kind="echo"), batching)
    assert echo.model_name == "echo" and echo.mode == "static"
    echo = create_engine(EngineConfig(kind="echo", echo_mode="in_flight"), batching)
    assert isinstance(echo, EchoInFlightEngine) and echo.mode == "in_flight"
    assert echo.capacity().sequences == batching.max_batch_size
    assert echo.capacity().tokens == batching.max_batch_tokens
    hf = create_engine(EngineConfig(kind="hf", model="/some/dir"), batching)
    assert hf.model_name == "/some/dir"
    trt = create_engine(EngineConfig(kind="trtllm", model="/ckpt"), batching)
    assert trt.model_name == "/ckpt"


def test_echo_engine_never_imports_torch_and_trtllm_is_imported_only_by_load() -> None:
    code = (
        "import sys\n"
        "from worker.config import BatchingConfig, EngineConfig\n"
        "from worker.engines.factory import create_engine\n"
        "e = create_engine(EngineConfig(kind='echo'), BatchingConfig())\n"
        "e.load()\n"
        "e.run_batch([], print)\n"
        "assert 'torch' not in sys.modules, 'echo imported torch'\n"
        "create_engine(EngineConfig(kind='trtllm'), BatchingConfig())\n"
        "assert 'tensorrt_llm' not in sys.modules\n"
        "assert 'torch' not in sys.modules, 'creating the trtllm engine imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
