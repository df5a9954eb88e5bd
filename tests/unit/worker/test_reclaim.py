"""Claiming the ids of assigned partitions (worker/kafka/reclaim.py): a failed claim is
retried on a timer until it succeeds, and never once its partition is released."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError

from worker.kafka.reclaim import Reclaimer

from .fake_producer import FakeProducers
from .fakes import FakeBroker
from .rig import WAIT_S

DOWN = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "no coordinator")


def test_a_failed_claim_is_retried_until_it_succeeds() -> None:
    broker = FakeBroker("requests", 2)
    reclaimer = Reclaimer(FakeProducers(broker))
    broker.fail("init_transactions", DOWN, times=2)  # the claim and the first retry
    reclaimer.claim(["id.1"])
    assert reclaimer.pending == {"id.1"} and broker.epoch("id.1") == 0
    deadline = time.monotonic() + WAIT_S
    while reclaimer.pending:
        assert time.monotonic() < deadline, "the claim was never retried"
        time.sleep(0.05)
    assert broker.epoch("id.1") == 1  # claimed: whoever used it before is fenced
    reclaimer.close()


def test_a_released_id_is_not_retried() -> None:
    broker = FakeBroker("requests", 2)
    reclaimer = Reclaimer(FakeProducers(broker))
    broker.fail("init_transactions", DOWN)
    reclaimer.claim(["id.1"])
    reclaimer.release(["id.1"])  # revoked: its next owner claims it
    assert reclaimer.pending == set() and reclaimer._timer is None
    reclaimer.close()
