"""The API server against the session's broker: a config with topics and a file store of
its own per test, two API keys, and the official ``openai`` SDK pointed at it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from openai import OpenAI

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
