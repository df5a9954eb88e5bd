"""Every transaction the worker commits becomes visible to read_committed readers.

The embedded broker (Tansu 0.6, ``dynostore.rs`` ``txn_end``) only completes an ended
transaction once every other transaction on the same partitions that began before it
ended is ended too; until then it stays PrepareCommit and holds back the partitions'
last stable offset. A transaction left there is completed by the end of a later one that
shares a partition with it, or by its own producer's next transaction, so a chain of
overlapping transactions whose first link's producer then falls idle kept results
invisible for good (issue 24: 7 of 9 results read, 9 read_uncommitted). One worker's
transactions follow each other since issue 32, but other workers' still overlap them.

The chain here: the worker's transaction writes results partition 0 while another
worker's, open, writes 0 and 1; a third's writes 1. The worker's ends while the second is
open, the second while the third is open; the third completes itself and the second (they
share partition 1) but not the worker's, until the worker, idle, ends one more.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from functools import partial
from uuid import uuid4

import pytest

from batcher import OffsetTracker, Partition
from tests.integration.harness import read_topic
from worker.config import Config
from worker.kafka import clients
from worker.kafka.transactions import TransactionalPublisher

pytestmark = pytest.mark.integration

RESULT_PARTITIONS = 2


def _key(partition: int, name: str) -> bytes:
    """A key librdkafka's default partitioner (CRC-32 of the key) puts on ``partition``."""
    for n in range(1000):
        key = f"{name}-{n}".encode()
        if zlib.crc32(key) % RESULT_PARTITIONS == partition:
            return key
    raise AssertionError("unreachable: half of all keys land on each partition")


def test_a_chain_of_overlapping_transactions_all_become_visible(kafka_config: Config) -> None:
    k = replace(kafka_config.kafka, partitions=1)
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    tracker = OffsetTracker()
    publisher = TransactionalPublisher(
        k, clients.consumer(k), tracker, clients.Producers(k, 1_000_000), f"chain-{uuid4()}"
    )
    origin: Partition = (k.requests_topic, 0)
    publisher.assign([origin])
    others = [clients.producer(k, transactional_id=f"other-{uuid4()}") for _ in range(2)]
    for other in others:
        other.init_transactions(15)
        other.begin_transaction()
    second, third = others
    first, seconds = _key(0, "first"), [_key(0, "second"), _key(1, "second")]
    for key in seconds:
        second.produce(k.results_topic, b"answer", key)
    second.flush(15)  # at the broker, in an open transaction
    tracker.add(origin, 0)
    publisher.send(k.results_topic, first, b"answer", [], origin, partial(tracker.done, origin, 0))
    try:
        publisher.commit()  # ends while the second is open
        last = _key(1, "third")
        third.produce(k.results_topic, b"answer", last)
        third.flush(15)
        second.commit_transaction(15)  # ends while the third is open
        third.commit_transaction(15)
        publisher.commit()  # the next commit interval: the worker is idle now
        records = read_topic(kafka_config, k.results_topic, 4, timeout_s=15)
        assert sorted(m.key() or b"" for m in records) == sorted([first, *seconds, last])
    finally:
        publisher.close()
