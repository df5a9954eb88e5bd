"""What real TensorRT-LLM 1.2.1 does that a lenient stand-in hid (issue 28), on the stricter
stand-in (``fake_trtllm``: each point cites the source file it follows).

None of this ran on real TensorRT-LLM: its wheel cannot reach this project's GPU machine,
so the stand-in is the only TensorRT-LLM these tests see.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import resolved
from tests.unit.worker.engines.conftest import fake_trtllm_engine
from tests.unit.worker.engines.test_structured import SCHEMAS, fmt
from tests.unit.worker.engines.test_trtllm_inflight import drain, until, words
from worker.engines.base import Capacity, EngineInput
from worker.engines.support import refused_field, unsupported
from worker.engines.trtllm import TrtLlmEngine
from worker.errors import ErrorCode, RequestError
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams


def test_a_sampled_token_missing_from_logprobs_fails_only_its_request_with_5000(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    # item 1: TorchSampler's top-k of the raw distribution omits a non-argmax sample
    engine, _ = fake_trtllm
    prompt = words(engine, "sun moon star tree bird fish")
    sampled = resolved(max_tokens=6, temperature=1.0, logprobs=True)
    engine.submit(EngineInput("lp", prompt, sampled))
    engine.submit(EngineInput("ok", prompt, resolved(max_tokens=6)))
    done = drain(engine, {"lp", "ok"})
    assert done["ok"].error is None
    error = done["lp"].error
    assert error is not None and error.code == ErrorCode.ENGINE_FAILED
    assert "sampled token" in error.message
    assert engine.capacity() == Capacity(sequences=4, tokens=64)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 7),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("repetition_penalty", 1.2),
    ],
)
def test_seed_and_penalties_are_refused_with_4002_naming_them(
    fake_trtllm: tuple[TrtLlmEngine, Any], field: str, value: float
) -> None:
    # item 2: TorchSampler of 1.2.x applies no penalty and one generator seeded 42
    engine, _ = fake_trtllm
    # as admission does (Intake._resolve): the field refused, then its 4002
    refused = refused_field(engine, resolved(temperature=0.7, **{field: value}))
    assert refused == field
    error = unsupported(engine, refused, "c")
    assert (error.code, error.param, error.custom_id) == (ErrorCode.INVALID_PARAMETER, field, "c")


def test_the_stand_in_ignores_a_requests_seed_as_torchsampler_does(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    """Why seed is refused: the same seeded request twice gets two answers."""
    engine, _ = fake_trtllm
    prompt = words(engine, "sun moon star tree bird fish")
    for key in ("a", "b"):
        engine.submit(EngineInput(key, prompt, resolved(max_tokens=6, temperature=1.0, seed=7)))
    done = drain(engine, {"a", "b"})
    assert done["a"].text != done["b"].text


def test_close_aborts_and_shuts_down_on_the_loop_thread(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    # item 3: shutdown aborts pending results through the queue the loop writes to
    engine, llm = fake_trtllm
    llm.executor.hold()
    engine.submit(EngineInput("k", words(engine, "red"), resolved(max_tokens=1)))
    until(lambda: llm.executor.pending() == 1, "the request to reach TensorRT-LLM")
    engine.close()  # the stand-in raises on a write from a second thread
    assert llm.executor.abort_calls and llm.executor.is_shutdown()
    assert llm.executor._writer.name == "trtllm-loop"
    assert threading.current_thread().name != "trtllm-loop"


@pytest.fixture
def chat_checkpoint(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TrtLlmEngine, Any]]:
    """The tiny checkpoint with a chat model's generation_config.json: two EOS ids, the
    tokenizer's and an end of turn (``<pad>`` stands in for it: special, so never text)."""
    path = tmp_path / "chat"
    shutil.copytree(tiny_checkpoint, path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 1]}))
    yield from fake_trtllm_engine(path, monkeypatch)


def test_the_models_generation_config_eos_ids_end_generation(
    chat_checkpoint: tuple[TrtLlmEngine, Any],
) -> None:
    # item 4: only the tokenizer's EOS is TensorRT-LLM's end_id
    engine, llm = chat_checkpoint
    engine.submit(EngineInput("k", words(engine, "red blue"), resolved(max_tokens=8)))
    done = drain(engine, {"k"})["k"]
    assert (done.text, done.finish_reason, done.completion_tokens) == ("blue red", "stop", 3)
    assert llm.requests[-1][1].stop_token_ids == [1]


def test_a_stop_string_its_tokens_miss_counts_the_tokens_up_to_it(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    # item 5: "orld" tokenized alone matches no generated token, so generation runs on
    engine, _ = fake_trtllm
    prompt = words(engine, "one hello world sea")  # answered "sea world hello one"
    sampling = resolved(max_tokens=4, stop=("orld",), logprobs=True)
    engine.submit(EngineInput("k", prompt, sampling))
    done = drain(engine, {"k"})["k"]
    assert (done.text, done.finish_reason, done.completion_tokens) == ("sea w", "stop", 2)
    assert done.logprobs is not None
    assert [t.token for t in done.logprobs] == ["sea", "world"]


def test_strict_false_is_refused_and_a_strict_schema_is_compiled_strictly(
    fake_trtllm: tuple[TrtLlmEngine, Any],
) -> None:
    # item 6: TensorRT-LLM's grammar matcher compiles every json_schema strictly
    engine, llm = fake_trtllm
    loose = InferenceRequest(
        "loose",
        messages=(ChatMessage("user", "red"),),
        sampling=SamplingParams(response_format=fmt(SCHEMAS[1], strict=False)),
    )
    with pytest.raises(RequestError) as info:
        engine.encode(loose)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")
    assert "strict: false" in info.value.message
    strict = resolved(max_tokens=2, response_format=fmt(SCHEMAS[1]))
    engine.submit(EngineInput("strict", words(engine, "red"), strict))
    drain(engine, {"strict"})
    assert llm.executor.compiled == [(json.dumps(SCHEMAS[1]), True)]
