"""The trtllm engine's in-flight contract, driven through the stand-in ``tensorrt_llm``.

The stand-in (``fake_trtllm``) mimics TensorRT-LLM 1.2.x's LLM API as read from its
sources; these tests check what the engine does with it: each request completed exactly
once unless aborted, aborts whose late replies still reach a running loop, one refused
prompt failing only itself, honest token counts at stop strings, top_p 0 as greedy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.conftest import resolved
from worker.engines.base import Capacity, Completion, EngineInput
from worker.engines.trtllm import TrtLlmEngine, TrtLlmFailed

# tests/unit/worker/engines/conftest.py: batches of 4 sequences and 64 tokens


def words(engine: TrtLlmEngine, text: str) -> tuple[int, ...]:
    """Token ids of space-separated words of the tiny vocabulary."""
    ids: tuple[int, ...] = engine._encoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    return tuple(ids)


def until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def drain(engine: TrtLlmEngine, keys: set[str], timeout_s: float = 5.0) -> dict[str, Completion]:
    """Completions until every key in ``keys`` has one; each key exactly once."""
    seen: dict[str, Completion] = {}
    deadline = time.monotonic() + timeout_s
    while set(seen) != keys:
        assert time.monotonic() < deadline, f"no completion for {keys - set(seen)}"
        for done in engine.completions(timeout_s=0.1):
            assert done.key not in seen, f"{done.key} completed twice"
            assert done.key in keys, f"unexpected completion {done.key}"
            seen[done.key] = done
    return seen


def test_load_hands_the_configuration_to_tensorrt_llm(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    _, llm = fake_trtllm
    args = llm.args
    assert (args["backend"], args["max_batch_size"], args["max_num_tokens"]) == ("pytorch", 4, 64)
    assert args["load_format"] == "dummy"
    assert args["kv_cache_config"].free_gpu_memory_fraction == 0.9
    assert args["kv_cache_config"].enable_block_reuse is True


def test_every_request_completes_exactly_once(fake_trtllm: tuple[TrtLlmEngine, Any]) -> None:
    engine, _ = fake_trtllm
    prompt = words(engine, "hello world one three")
    items = [EngineInput(f"k{i}", prompt, resolved(max_tokens=1 + i)) for i in range(4)]
    for item in items:
        engine.submit(item)
    done = drain(engine, {i.key for i in items})
    for item in items:
        c = done[item.key]
        assert (c.error, c.finish_reason) == (None, "length")
        assert (c.prompt_tokens, c.completion_tokens) == (4, item.sampling.max_tokens)
    assert done["k1"].text == "three one"
    assert engine.completions() == []
    assert engine.capacity() == Capacity(sequences=4, tokens=64)


def test_capacity_counts_sequences_and_prompt_plus_max_tokens(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    llm.executor.hold()
    prompt = words(engine, "red blue green")
    engine.submit(EngineInput("a", prompt, resolved(max_tokens=10)))
    engine.submit(EngineInput("b", prompt, resolved(max_tokens=5)))
    assert engine.capacity() == Capacity(sequences=2, tokens=64 - 13 - 8)
    llm.executor.release()
    drain(engine, {"a", "b"})
    assert engine.capacity() == Capacity(sequences=4, tokens=64)


def test_an_aborted_request_is_never_completed_and_its_late_reply_reaches_the_loop(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    llm.executor.hold()
    prompt = words(engine, "sun moon star")
    engine.submit(EngineInput("gone", prompt, resolved(max_tokens=8)))
    engine.submit(EngineInput("kept", prompt, resolved(max_tokens=8)))
    until(lambda: llm.executor.pending() == 2, "both requests to reach TensorRT-LLM")
    engine.abort(["gone"])
    assert engine.capacity().sequences == 3
    until(lambda: len(llm.executor.abort_calls) == 1, "the abort to reach TensorRT-LLM")
    llm.executor.release()
    assert set(drain(engine, {"kept"})) == {"kept"}
    # the cancelled reply comes later than the abort, and still finds the loop running
    until(lambda: len(llm.executor.answered) == 2, "the reply to the aborted request")
    assert llm.executor.lost_replies == 0
    assert engine.completions(timeout_s=0.05) == []


def test_abort_of_an_unknown_or_finished_key_is_harmless(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, _ = fake_trtllm
    engine.submit(EngineInput("done", words(engine, "tree bird"), resolved(max_tokens=2)))
    drain(engine, {"done"})
    engine.abort(["done", "never-submitted"])
    assert engine.completions(timeout_s=0.05) == []
    assert engine.capacity() == Capacity(sequences=4, tokens=64)


def test_a_request_aborted_after_it_finished_but_before_it_was_read_is_never_completed(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, _ = fake_trtllm
    engine.submit(EngineInput("late", words(engine, "tree bird"), resolved(max_tokens=2)))
    until(lambda: engine.capacity() == Capacity(sequences=4, tokens=64), "the request finished")
    engine.abort(["late"])  # finished on the loop, not handed out yet
    engine.submit(EngineInput("next", words(engine, "sun moon"), resolved(max_tokens=2)))
    assert set(drain(engine, {"next"})) == {"next"}
    assert engine.completions(timeout_s=0.05) == []


@pytest.mark.parametrize("refusal", ["RequestError", "ValueError"])
def test_a_prompt_over_the_limit_fails_only_itself_with_4003(
    fake_trtllm: tuple[TrtLlmEngine, Any], refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, llm = fake_trtllm
    import tensorrt_llm

    # newer 1.2.x releases refuse with RequestError (a RuntimeError), earlier ones ValueError
    error = tensorrt_llm.executor.RequestError if refusal == "RequestError" else ValueError
    monkeypatch.setattr(type(llm), "limit_error", error)
    fits = words(engine, "hello world")
    engine.submit(EngineInput("long", fits * 33, resolved(max_tokens=1)))
    engine.submit(EngineInput("short", fits, resolved(max_tokens=1)))
    done = drain(engine, {"long", "short"})
    assert done["short"].error is None
    long = done["long"]
    assert long.error is not None and long.error.code == 4003
    assert "max_num_tokens" in long.error.message and long.prompt_tokens == 66


def test_an_error_reply_fails_only_its_request_with_5000(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    poison = words(engine, "fish")
    llm.executor.failing_tokens.update(poison)
    engine.submit(EngineInput("bad", words(engine, "sea fish"), resolved(max_tokens=3)))
    engine.submit(EngineInput("good", words(engine, "sea wave"), resolved(max_tokens=3)))
    done = drain(engine, {"bad", "good"})
    assert done["good"].error is None
    bad = done["bad"]
    assert bad.error is not None and bad.error.code == 5000 and bad.finish_reason == "error"


@pytest.mark.parametrize(("stop", "tokens"), [("world", 2), ("world hello", 3)])
def test_a_stop_string_cuts_the_text_and_its_tokens_are_counted(
    fake_trtllm: tuple[TrtLlmEngine, Any], stop: str, tokens: int
) -> None:
    engine, llm = fake_trtllm
    # the stand-in answers with the prompt reversed: "sea world hello one"
    prompt = words(engine, "one hello world sea")
    engine.submit(EngineInput("k", prompt, resolved(max_tokens=8, stop=(stop,))))
    done = drain(engine, {"k"})["k"]
    assert (done.text, done.finish_reason, done.completion_tokens) == ("sea ", "stop", tokens)
    sent = llm.requests[-1][1]
    assert sent.stop == [stop] and sent.include_stop_str_in_output is True


def test_an_end_token_is_counted(fake_trtllm: tuple[TrtLlmEngine, Any]) -> None:
    engine, _ = fake_trtllm
    engine.submit(EngineInput("k", words(engine, "red blue"), resolved(max_tokens=8)))
    done = drain(engine, {"k"})["k"]
    assert (done.text, done.finish_reason, done.completion_tokens) == ("blue red", "stop", 3)


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        ({"temperature": 0.0}, (1, None, None)),
        ({"temperature": 0.7, "top_p": 0.0}, (1, None, None)),
        ({"temperature": 0.7, "top_p": 0.5, "top_k": 5}, (5, 0.5, 0.7)),
    ],
)
def test_greedy_and_top_p_zero_are_sent_as_top_k_one(
    fake_trtllm: tuple[TrtLlmEngine, Any], sampling: dict[str, float], expected: tuple[Any, ...]
) -> None:
    engine, llm = fake_trtllm
    engine.submit(EngineInput("k", words(engine, "red"), resolved(max_tokens=1, **sampling)))
    drain(engine, {"k"})
    sent = llm.requests[-1][1]
    assert (sent.top_k, sent.top_p, sent.temperature) == expected


def test_a_failed_executor_raises_from_completions_and_submit_after_what_finished(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    engine, llm = fake_trtllm
    engine.submit(EngineInput("before", words(engine, "red"), resolved(max_tokens=1)))
    until(lambda: len(llm.executor.answered) == 1, "the first request's reply")
    llm.executor.crash(RuntimeError("CUDA error: an illegal memory access"))
    engine.submit(EngineInput("k", words(engine, "red"), resolved(max_tokens=1)))
    until(lambda: len(llm.executor.answered) == 2, "the failed reply")
    assert [c.key for c in engine.completions(timeout_s=5.0)] == ["before"]
    with pytest.raises(TrtLlmFailed, match="illegal memory access"):
        engine.completions(timeout_s=5.0)
    with pytest.raises(TrtLlmFailed):
        engine.submit(EngineInput("k2", words(engine, "red"), resolved(max_tokens=1)))


def test_close_aborts_what_is_in_flight(fake_trtllm: tuple[TrtLlmEngine, Any]) -> None:
    engine, llm = fake_trtllm
    llm.executor.hold()
    engine.submit(EngineInput("k", words(engine, "red"), resolved(max_tokens=1)))
    until(lambda: llm.executor.pending() == 1, "the request to reach TensorRT-LLM")
    engine.close()
    assert llm.executor.abort_calls and llm.executor.is_shutdown()
