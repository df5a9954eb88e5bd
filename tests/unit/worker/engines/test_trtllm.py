"""The TensorRT-LLM engine: what can be checked without it, and its mapping where it exists."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.unit.conftest import resolved
from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import EngineInput
from worker.engines.trtllm import TrtLlmEngine
from worker.errors import ModelLoadError

HAVE_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
TRTLLM_SKIP = "tensorrt_llm not installed (needs an NVIDIA GPU); not run on this machine"
needs_trtllm = pytest.mark.skipif(not HAVE_TRTLLM, reason=TRTLLM_SKIP)


@pytest.mark.skipif(HAVE_TRTLLM, reason="checks the message shown where TensorRT-LLM is missing")
def test_load_without_tensorrt_llm_is_a_model_load_error_that_says_so() -> None:
    engine = TrtLlmEngine(EngineConfig(kind="trtllm", model="/models/llama"))
    with pytest.raises(ModelLoadError, match="tensorrt_llm is not importable") as caught:
        engine.load()
    assert caught.value.code == 5003
    with pytest.raises(RuntimeError, match="load"):
        engine.run_batch([], print)


@needs_trtllm
def test_a_gguf_model_is_refused_before_tensorrt_llm_starts() -> None:
    with pytest.raises(ModelLoadError, match="not GGUF"):
        TrtLlmEngine(EngineConfig(kind="trtllm")).load()


@needs_trtllm
def test_sampling_params_map_greedy_to_top_k_one_and_keep_stop_strings() -> None:
    engine = TrtLlmEngine(EngineConfig(kind="trtllm"))
    engine._sampling_params = importlib.import_module("tensorrt_llm").SamplingParams
    greedy_input = EngineInput("k", (1, 2), resolved(max_tokens=7, temperature=0, stop=("\n",)))
    greedy = engine._params(greedy_input)
    assert (greedy.top_k, greedy.temperature, greedy.max_tokens) == (1, None, 7)
    assert greedy.stop == ["\n"] and greedy.end_id is None
    sampled = engine._params(EngineInput("k", (1,), resolved(temperature=0.5, seed=3)))
    assert (sampled.temperature, sampled.seed) == (0.5, 3)
    # the resolved "off" values are TensorRT-LLM's own: every token stays in, no penalty
    assert (sampled.top_k, sampled.top_p) == (0, 1.0)
    penalties = (sampled.repetition_penalty, sampled.presence_penalty, sampled.frequency_penalty)
    assert penalties == (1.0, 0.0, 0.0)


@pytest.mark.skipif(
    not os.environ.get("BATCHPIPE_TRTLLM_MODEL"),
    reason="set BATCHPIPE_TRTLLM_MODEL to a local Hugging Face model directory",
)
@needs_trtllm
def test_a_real_checkpoint_serves_a_batch() -> None:
    engine = TrtLlmEngine(
        EngineConfig(kind="trtllm", model=os.environ["BATCHPIPE_TRTLLM_MODEL"]),
        BatchingConfig(max_batch_size=8),
    )
    engine.load()
    try:
        ids = (1, 2, 3, 4)
        done: list[str] = []
        inputs = [EngineInput(f"k{i}", ids, resolved(max_tokens=4)) for i in range(3)]
        engine.run_batch(inputs, lambda c: done.append(c.key))
        assert sorted(done) == ["k0", "k1", "k2"]
    finally:
        engine.close()
