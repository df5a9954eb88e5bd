"""A feeder step puts its slices on the broker before the state record that says they were
fed (worker/feeder/mover.py).

The embedded broker shows read_committed readers the records of aborted transactions too.
A feeder killed mid-step with its ``fed_to`` on the broker and part of its slice still in
librdkafka's queue made the next feeder skip requests that were never written: CI's
three-worker fair-share test lost 22 requests in one takeover that way (reproduced on a
broker slowed by 900 transactional ids). Here a feeder moves two batches alone (no
worker, so the depth floor is raised to hold them all) while every producer call on the
state topic notes how many records librdkafka still held undelivered at that moment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from batchpipe.client import Client
from bench.fairness import lines
from tests.integration.harness import read_topic
from worker.config import Config
from worker.feeder.feeder import Feeder
from worker.feeder.naming import state_topic
from worker.kafka import clients
from worker.wire.codec import CodecLimits, decode_request

pytestmark = pytest.mark.integration


class _Noting:
    """A producer that notes, at each record for ``watched``, how many records of other
    topics it still held undelivered."""

    def __init__(self, inner: Any, watched: str, held: list[int]) -> None:
        self._inner, self._watched, self._held = inner, watched, held
        self._watched_queued = 0  # records for ``watched`` since the last commit

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if topic == self._watched:
            self._held.append(len(self._inner) - self._watched_queued)
            self._watched_queued += 1
        self._inner.produce(topic, *args, **kwargs)

    def commit_transaction(self, *args: Any) -> None:
        self._inner.commit_transaction(*args)
        self._watched_queued = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_steps_state_is_produced_only_once_its_slices_are_acknowledged(
    kafka_config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = replace(
        kafka_config,
        kafka=replace(kafka_config.kafka, partitions=6),
        engine=replace(kafka_config.engine, kind="echo", model="echo"),
        scheduling=replace(kafka_config.scheduling, fair=True, min_depth=4_000),
    )
    held: list[int] = []
    plain = clients.producer

    def noting(*args: Any, **kwargs: Any) -> Any:
        return _Noting(plain(*args, **kwargs), state_topic(config.kafka.requests_topic), held)

    client = Client(config)
    client.submit(lines("a", 1_500), key="a")
    client.submit(lines("b", 1_500), key="b")
    monkeypatch.setattr(clients, "producer", noting)  # the feeder's, from here on
    feeder = Feeder(config, CollectorRegistry())
    feeder.start()
    try:
        moved = read_topic(config, config.kafka.requests_topic, 3_000, timeout_s=120)
    finally:
        feeder.stop()
    limits = CodecLimits.from_config(config.limits)
    ids = [decode_request(m.value(), m.headers(), limits).custom_id for m in moved]
    assert sorted(ids) == sorted(f"{p}-{i}" for p in "ab" for i in range(1_500))
    assert held, "no state record was produced"
    assert set(held) == {0}, f"state produced with records undelivered: {held[:20]}"
