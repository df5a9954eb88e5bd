"""The integration tests' broker and a per-test configuration with topics of its own.

``KAFKA_BOOTSTRAP`` when set (e.g. Apache Kafka from docker-compose) serves the whole
session; else each test module starts an embedded Tansu broker of its own (a fraction of
a second). Tansu keeps every transactional id and each of its producer epochs in one
metadata document that it rewrites whole on every change, and never drops one, so a
broker that served the whole session slowed test by test: the three-worker fair-share
test took 61 s on a fresh broker and 167 s after the modules before it (docs/
architecture.md §7). Modules whose tests each start hundreds of producers or thousands of
transactions (the publishers' races, the fair-share races) start one per test instead
(``own_broker``). Each test gets unique topic names and group id, so tests never see
each other's records. The chaos scenarios add their rows to one session report
(``chaos_report``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.integration.chaos_report import ChaosReport, report_path
from tests.integration.harness import isolated_config
from worker.config import Config
from worker.kafka.broker import EmbeddedBroker


@contextmanager
def own_broker() -> Iterator[str]:
    """``KAFKA_BOOTSTRAP``, or an embedded broker of its own until the block ends."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    with EmbeddedBroker() as broker:
        yield broker.bootstrap


@pytest.fixture(scope="module")
def kafka_bootstrap() -> Iterator[str]:
    with own_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def kafka_config(kafka_bootstrap: str) -> Config:
    return isolated_config(kafka_bootstrap)


@pytest.fixture(scope="session")
def chaos_report() -> Iterator[ChaosReport]:
    """Collects the chaos scenarios' rows; written at the end when ``BATCHPIPE_CHAOS_REPORT``
    names a file."""
    report = ChaosReport()
    yield report
    path = report_path()
    if path is not None and report.scenarios:
        report.write(path)
