"""Engine fixtures: a tiny random-weight Llama (fast, always) and SmolLM2 (``model`` mark).

SmolLM2 takes 10–20 s to load from GGUF, so it is loaded once per session.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from worker.config import BatchingConfig, GenerationConfig
from worker.engines.base import ResolvedSampling
from worker.wire.messages import SamplingParams

TINY_WORDS = (
    "what is two plus the name a color write short poem about sea who wrote hamlet",
    "hello world one three four five red blue green wave sun moon star tree bird fish",
)
TINY_SPECIALS = ("<unk>", "<pad>", "<s>", "</s>", "system", "user", "assistant", "think")
TINY_TEMPLATE = (
    "<s>{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if enable_thinking %}think {% endif %}assistant"
)


def resolved(**sampling: Any) -> ResolvedSampling:
    """``SamplingParams(**sampling)`` as intake resolves it under the default configuration."""
    return ResolvedSampling.resolve(SamplingParams(**sampling), None, GenerationConfig())


def tiny_llama(vocab_size: int = 96, seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer Llama with random weights and a word-level tokenizer (decodes word by word)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = list(dict.fromkeys([*TINY_SPECIALS, *" ".join(TINY_WORDS).split()]))
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    tokenizer.chat_template = TINY_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config), tokenizer  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def tiny_hf_engine() -> Iterator[Any]:
    from worker.config import EngineConfig
    from worker.engines.hf.engine import HFEngine

    engine = HFEngine(EngineConfig(model="tiny-llama", device="cpu"), preloaded=tiny_llama())
    engine.load()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_engine() -> Iterator[Any]:
    """SmolLM2-135M-Instruct on the CPU; tests using it carry ``@pytest.mark.model``."""
    from worker.config import EngineConfig
    from worker.engines.hf.engine import HFEngine

    engine = HFEngine(EngineConfig(device="cpu"))
    engine.load()
    yield engine
    engine.close()


#: the vllm engine's test limits: small, so its KV cache is small (tests check 4003 at them)
VLLM_TEST_BATCHING = BatchingConfig(max_batch_size=8, max_batch_tokens=1024, prefetch_count=8)


@pytest.fixture(scope="module")
def vllm_engine() -> Iterator[Any]:
    """SmolLM2-135M-Instruct through vLLM on the CPU; tests using it carry
    ``@pytest.mark.model``. The GGUF converts once into the default model cache.

    One per module, never one per session: vLLM keeps its parallel groups process-wide,
    and another vLLM engine closed while this one lived (the embedding engine's module)
    would tear them down under it ("pipeline model parallel group is not initialized")."""
    from worker.config import EngineConfig
    from worker.engines.vllm.engine import VllmEngine

    engine = VllmEngine(EngineConfig(kind="vllm"), VLLM_TEST_BATCHING)
    engine.load()
    yield engine
    engine.close()
