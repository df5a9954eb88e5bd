"""Every transaction the worker commits becomes visible to read_committed readers.

The embedded broker (Tansu 0.6, ``dynostore.rs`` ``txn_end``) only completes an ended
transaction once every other transaction on the same partitions that began before it
ended is ended too; until then it stays PrepareCommit and holds back the partitions'
last stable offset. A transaction left there is completed by the end of a later one that
shares a partition with it, or by its own producer's next transaction, so a chain of
overlapping transactions of one worker whose first link's producer then falls idle kept
results invisible for good (issue 24: 7 of 9 results read, 9 read_uncommitted).

The chain here: three input partitions, so three transactional producers, committed in
order; the first writes to results partition 0, the second to 0 and 1, the third to 1.
The first ends while the second is open, the second while the third is open; the third
completes itself and the second (they share partition 1) but not the first.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from functools import partial
from uuid import uuid4

import pytest

from batcher import OffsetTracker, Partition
from tests.integration.harness import drain, read_topic, reader
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
    k = replace(kafka_config.kafka, partitions=3)
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [k.results_topic], partitions=RESULT_PARTITIONS)
    tracker = OffsetTracker()
    publisher = TransactionalPublisher(
        k,
        clients.consumer(k),
        tracker,
        clients.Producers(k, 1_000_000),
        f"chain-{uuid4()}",
    )
    origins: list[Partition] = [(k.requests_topic, p) for p in range(3)]
    publisher.assign(origins)  # producers end their transactions in this order
    writes = {
        0: [_key(0, "first")],
        1: [_key(0, "second"), _key(1, "second")],
        2: [_key(1, "third")],
    }
    for number, keys in writes.items():
        origin = origins[number]
        for offset, key in enumerate(keys):
            tracker.add(origin, offset)
            publisher.send(
                k.results_topic,
                key,
                b"answer",
                [],
                origin,
                partial(tracker.done, origin, offset),
            )
    try:
        # every record is at the broker before the first commit, as under load (linger.ms
        # is 5, the commit interval 100): each transaction overlaps those still open
        seen = drain(reader(kafka_config, k.results_topic, read_committed=False), 15, 4)
        landed = {(m.partition(), m.key()) for m in seen}
        assert landed == {(zlib.crc32(key) % 2, key) for keys in writes.values() for key in keys}
        publisher.commit()
        publisher.commit()  # the next commit interval: every producer is idle now
        records = read_topic(kafka_config, k.results_topic, 4, timeout_s=15)
        assert sorted(m.key() or b"" for m in records) == sorted(
            key for keys in writes.values() for key in keys
        )
    finally:
        publisher.close()
