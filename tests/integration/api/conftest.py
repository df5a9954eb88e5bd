"""The API server against the session's broker: a config with topics and a file store of
its own per test, two API keys, the official ``openai`` SDK pointed at it, and the
server's expiry clock moved forward (``clock``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from openai import OpenAI

from batchpipe.api import retention
from batchpipe.api.app import Server
from batchpipe.api.auth import Keys
from worker.config import Config, EngineConfig

KEYS = Keys({"sk-alice": "alice", "sk-bob": "bob"})

Serve = Callable[..., AbstractContextManager[Server]]


@pytest.fixture
def api_config(kafka_config: Config, tmp_path: Path) -> Config:
    """Echo engine, a file store under ``tmp_path``, its own state and control topics."""
    suffix = uuid.uuid4().hex[:12]
    kafka = replace(
        kafka_config.kafka,
        state_topic=f"test-api-state-{suffix}",
        control_topic=f"test-control-{suffix}",
    )
    api = replace(kafka_config.api, store_dir=str(tmp_path / "files"), poll_interval_ms=100, port=0)
    return replace(kafka_config, kafka=kafka, api=api, engine=EngineConfig(kind="echo"))


@pytest.fixture
def serve() -> Serve:
    @contextmanager
    def run(config: Config, keys: Keys = KEYS) -> Iterator[Server]:
        with Server(config, keys) as server:
            yield server

    return run


def sdk(server: Server, key: str = "sk-alice") -> OpenAI:
    """The official SDK, unchanged but for ``base_url`` and ``api_key``."""
    return OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


class Clock:
    """The server's expiry clock (:func:`batchpipe.api.retention.now`), ``shift`` seconds
    ahead of the real one: expiry windows are an hour at least."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shift = 0.0
        monkeypatch.setattr(retention, "now", lambda: time.time() + self.shift)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)
