"""With fair share a batch is written without a transaction, its end marker last, only
once every record was acknowledged, with their count; heartbeats while lines are slow;
and readers tell a publish in progress or cut short from a batch not visible yet (issue
49, docs/architecture.md §10 "Publish without transactions")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from batchpipe import client as client_module
from batchpipe.batchfile import validate_requests
from batchpipe.client import NOT_VISIBLE, PUBLISHING, Client, Sighting
from worker.config import Config
from worker.feeder.headers import scheduled_as
from worker.feeder.naming import HOLD_S
from worker.kafka import clients


class Producer:
    """Records what is produced; a delivery fails for the keys in ``failing``."""

    def __init__(self, failing: frozenset[bytes] = frozenset()) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, list[Any]]] = []
        self.flushes: list[int] = []  # records produced at each flush
        self._failing = failing
        self._reports: list[Any] = []
        self._on_delivery: Any = None

    def configured(self, extra: dict[str, Any]) -> Producer:
        """As librdkafka with the publisher's settings: a report for each failure only."""
        assert extra["delivery.report.only.error"] is True
        self._on_delivery = extra["on_delivery"]
        return self

    def produce(self, topic: str, value: Any = None, key: Any = None, **kw: Any) -> None:
        self.records.append((topic, key, value, list(kw.get("headers") or [])))
        callback = kw.get("on_delivery") or self._on_delivery
        if key in self._failing:
            self._reports.append((callback, KafkaError(KafkaError._MSG_TIMED_OUT)))

    def poll(self, timeout: float = 0) -> int:
        return self._serve()

    def flush(self, timeout: float = 0) -> int:
        self.flushes.append(len(self.records))
        self._serve()
        return 0

    def _serve(self) -> int:
        served, self._reports = self._reports, []
        for callback, error in served:
            callback(error, None)
        return len(served)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} called: the pending topic is written without transactions")


def _client(monkeypatch: pytest.MonkeyPatch, producer: Producer) -> Client:
    monkeypatch.setattr(clients, "producer", lambda *a, **k: producer.configured(k["extra"]))
    monkeypatch.setattr(clients, "ensure_topics", lambda *a, **k: None)
    monkeypatch.setattr(client_module, "ensure_pending", lambda *a, **k: None)
    config = Config()
    return Client(replace(config, scheduling=replace(config.scheduling, fair=True)))


def _rows(n: int) -> list[dict[str, Any]]:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    return [
        {"custom_id": f"r-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i in range(n)
    ]


def test_records_then_their_count_on_the_end_marker_after_every_acknowledgement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer()
    _client(monkeypatch, producer).submit(_rows(3), "b1", key="k")
    kinds = [scheduled_as(headers) for _, _, _, headers in producer.records]
    assert [k.end for k in kinds] == [False, False, False, True]
    assert all(k.sealed for k in kinds[:3]) and kinds[3].count == 3
    assert {k.batch_id for k in kinds} == {"b1"}
    assert producer.flushes == [3, 4]  # the three acknowledged before the marker is written


def test_a_failed_delivery_fails_the_publish_and_writes_no_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer(failing=frozenset({b"r-1"}))
    with pytest.raises(KafkaException):
        _client(monkeypatch, producer).submit(_rows(3), "b2")
    assert not any(scheduled_as(h).end for _, _, _, h in producer.records)


def test_a_slow_read_writes_heartbeats_which_are_no_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "CHUNK_S", 0.02)
    monkeypatch.setattr(client_module, "ALIVE_S", 0.05)
    producer = Producer()
    client = _client(monkeypatch, producer)

    def slow() -> Iterator[Any]:
        for request in validate_requests(_rows(2), client.limits):
            time.sleep(0.3)  # a slow store
            yield request

    client._publish(slow(), 2, "b3", {"echo"}, None, "")
    kinds = [scheduled_as(h) for _, _, _, h in producer.records]
    beats = [k for k in kinds if k.alive]
    assert beats and all(k.batch_id == "b3" and not k.sealed for k in beats)
    assert kinds[-1].end and kinds[-1].count == 2


def test_what_readers_say_of_a_batch_with_no_answer_yet() -> None:
    now = 1_000_000.0
    assert Sighting(hidden=True).detail(now) == NOT_VISIBLE
    publishing = Sighting(request=object(), sealed=True, last_at=now - 1)  # type: ignore[arg-type]
    assert publishing.detail(now) == PUBLISHING and not publishing.interrupted(now)
    cut = Sighting(request=object(), sealed=True, last_at=now - HOLD_S - 1)  # type: ignore[arg-type]
    assert cut.interrupted(now) and "publish incomplete" in (cut.detail(now) or "")
    ended = Sighting(request=object(), sealed=True, ended=True, last_at=now - 3600)  # type: ignore[arg-type]
    assert not ended.interrupted(now) and ended.detail(now) is None
