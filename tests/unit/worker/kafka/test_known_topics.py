"""Topic creation asks the broker once a minute at most for a topic it knows exists:
``serve`` made an admin client and listed every topic twice per batch it published."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from worker.config import KafkaConfig
from worker.kafka import clients


@dataclass
class _Future:
    def result(self) -> None:
        return None


@dataclass
class _Admin:
    topics: set[str]
    listed: int = 0
    created: list[str] = field(default_factory=list)

    def list_topics(self, timeout: float) -> Any:
        self.listed += 1
        return type("Metadata", (), {"topics": {t: None for t in self.topics}})()

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, _Future]:
        names = [t.topic for t in new]
        self.created += names
        self.topics |= set(names)
        return {name: _Future() for name in names}


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> _Admin:
    fake = _Admin({"requests"})
    monkeypatch.setattr(clients, "admin", lambda kafka: fake)
    monkeypatch.setattr(clients, "_KNOWN", {})
    return fake


def test_a_topic_known_to_exist_is_not_asked_about_again(
    broker: _Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_000.0]
    monkeypatch.setattr("worker.kafka.clients.time", SimpleNamespace(monotonic=lambda: now[0]))
    kafka = KafkaConfig(bootstrap_servers="b:9092")
    assert clients.ensure_topics(kafka, ["requests", "results"]) == ["results"]
    assert (broker.listed, broker.created) == (1, ["results"])
    now[0] += clients.KNOWN_S - 1
    assert clients.ensure_topics(kafka, ["results", "requests"]) == []
    assert broker.listed == 1  # both known: no admin client, no listing
    assert clients.ensure_topics(kafka, ["requests", "other"]) == ["other"]
    assert broker.listed == 2  # one unknown: the broker is asked
    # another broker's topic of the same name is not known
    assert clients.ensure_topics(KafkaConfig(bootstrap_servers="c:9092"), ["requests"]) == []
    assert broker.listed == 3
    # after the window the broker is asked again: a topic deleted meanwhile is recreated
    now[0] += clients.KNOWN_S
    broker.topics.discard("results")
    assert clients.ensure_topics(kafka, ["results"]) == ["results"]
    assert broker.listed == 4


def test_a_failed_publish_or_a_stopped_broker_forgets_what_is_known(broker: _Admin) -> None:
    """Review s5 #3: an embedded broker keeps nothing across a restart on its address."""
    here, there = KafkaConfig(bootstrap_servers="b:9092"), KafkaConfig(bootstrap_servers="c:1")
    clients.ensure_topics(here, ["requests"])
    clients.ensure_topics(there, ["requests"])
    assert broker.listed == 2
    clients.forget_topics("b:9092")
    clients.ensure_topics(there, ["requests"])
    assert broker.listed == 2  # the other broker's are still known
    clients.ensure_topics(here, ["requests"])
    assert broker.listed == 3  # asked again
