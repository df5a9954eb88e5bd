"""The integration session's broker and a per-test configuration with topics of its own.

One broker serves the whole session: ``KAFKA_BOOTSTRAP`` when set (e.g. Apache Kafka
from docker-compose), else the embedded Tansu broker, started once. Each test gets
unique topic names and group id, so tests never see each other's records.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from worker.broker import EmbeddedBroker
from worker.config import Config


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture
def kafka_config(kafka_bootstrap: str) -> Config:
    suffix = uuid.uuid4().hex[:12]
    config = Config()
    kafka = replace(
        config.kafka,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"test-group-{suffix}",
        requests_topic=f"test-requests-{suffix}",
        results_topic=f"test-results-{suffix}",
        dead_letter_topic=f"test-dead-letter-{suffix}",
        partitions=3,
    )
    return replace(config, kafka=kafka)
