"""The TensorRT-LLM engine against the real ``tensorrt_llm``: skipped where it is not installed.

``test_trtllm_inflight.py`` drives the engine through a stand-in package on any machine.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from tests.unit.conftest import resolved
from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import EngineInput
from worker.engines.trtllm import TrtLlmEngine
from worker.engines.trtllm.mapping import sampling_kwargs
from worker.errors import ModelLoadError

HAVE_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None
TRTLLM_SKIP = (
    "tensorrt_llm not installed (needs an NVIDIA GPU; its wheel is far over what can be "
    "carried to this project's GPU machine, which has no network): not run anywhere here"
)
needs_trtllm = pytest.mark.skipif(not HAVE_TRTLLM, reason=TRTLLM_SKIP)


@pytest.mark.skipif(HAVE_TRTLLM, reason="checks the message shown where TensorRT-LLM is missing")
def test_load_without_tensorrt_llm_is_a_model_load_error_that_says_so() -> None:
    engine = TrtLlmEngine(EngineConfig(kind="trtllm", model="/models/llama"))
    with pytest.raises(ModelLoadError, match="tensorrt_llm is not importable") as caught:
        engine.load()
    assert caught.value.code == 5003
    with pytest.raises(RuntimeError, match="load"):
        engine.submit(EngineInput("k", (1,), resolved()))


@needs_trtllm
def test_a_gguf_model_is_refused_before_tensorrt_llm_starts() -> None:
    with pytest.raises(ModelLoadError, match="not GGUF"):
        TrtLlmEngine(EngineConfig(kind="trtllm")).load()


@needs_trtllm
def test_sampling_params_take_the_mapped_settings() -> None:
    from tensorrt_llm import SamplingParams

    greedy = SamplingParams(
        **sampling_kwargs(resolved(max_tokens=7, temperature=0, stop=("\n",)), ignore_eos=False)
    )
    assert (greedy.top_k, greedy.temperature, greedy.max_tokens) == (1, None, 7)
    assert greedy.stop == ["\n"] and greedy.end_id is None
    assert greedy.include_stop_str_in_output is True
    sampled = SamplingParams(**sampling_kwargs(resolved(temperature=0.5, seed=3), ignore_eos=True))
    assert (sampled.temperature, sampled.seed, sampled.ignore_eos) == (0.5, 3, True)
    # the resolved "off" values are TensorRT-LLM's own: every token stays in, no penalty
    assert (sampled.top_k, sampled.top_p) == (0, 1.0)
    penalties = (sampled.repetition_penalty, sampled.presence_penalty, sampled.frequency_penalty)
    assert penalties == (1.0, 0.0, 0.0)


@pytest.mark.skipif(
    not os.environ.get("BATCHPIPE_TRTLLM_MODEL"),
    reason="set BATCHPIPE_TRTLLM_MODEL to a local Hugging Face model directory",
)
@needs_trtllm
def test_a_real_checkpoint_serves_requests_in_flight() -> None:
    engine = TrtLlmEngine(
        EngineConfig(kind="trtllm", model=os.environ["BATCHPIPE_TRTLLM_MODEL"]),
        BatchingConfig(max_batch_size=8),
    )
    engine.load()
    try:
        ids = (1, 2, 3, 4)
        for i in range(3):
            engine.submit(EngineInput(f"k{i}", ids, resolved(max_tokens=4)))
        done: list[str] = []
        deadline = time.monotonic() + 120
        while len(done) < 3 and time.monotonic() < deadline:
            done += [c.key for c in engine.completions(timeout_s=1.0)]
        assert sorted(done) == ["k0", "k1", "k2"]
    finally:
        engine.close()
