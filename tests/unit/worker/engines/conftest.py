"""The trtllm engine on the stand-in ``tensorrt_llm`` (``fake_trtllm``), for any machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.conftest import tiny_llama
from tests.unit.worker.engines.fake_trtllm import install, uninstall
from worker.config import BatchingConfig, EngineConfig

FAKE_TRTLLM_BATCHING = BatchingConfig(max_batch_size=4, max_batch_tokens=64, prefetch_count=8)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory without weights: config.json and the tiny tokenizer."""
    path = tmp_path_factory.mktemp("tiny-checkpoint")
    tiny_llama()[1].save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


def fake_trtllm_engine(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any]]:
    """A loaded trtllm engine (``FAKE_TRTLLM_BATCHING``) on ``checkpoint`` and the stand-in
    ``LLM`` it made; closed afterwards."""
    install(monkeypatch)
    import tensorrt_llm

    from worker.engines.trtllm import TrtLlmEngine

    config = EngineConfig(kind="trtllm", model=str(checkpoint), load_format="dummy")
    engine = TrtLlmEngine(config, FAKE_TRTLLM_BATCHING)
    engine.load()
    try:
        yield engine, tensorrt_llm.LLM.instances[-1]
    finally:
        engine.close()
        uninstall()


@pytest.fixture
def fake_trtllm(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Any]]:
    """A loaded trtllm engine (``FAKE_TRTLLM_BATCHING``) and the stand-in ``LLM`` it made."""
    yield from fake_trtllm_engine(tiny_checkpoint, monkeypatch)
