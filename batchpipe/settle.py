"""A one-shot transactional publisher makes sure its committed batch becomes visible.

With ``scheduling.fair: false`` a batch is one transaction on the requests topic
(:meth:`batchpipe.client.Client._publish_direct`). The embedded broker completes an ended
transaction only once every transaction overlapping it on one of its partitions has
ended too, and checks that only when a transaction of the same producer ends
(docs/architecture.md §7): a publisher that committed while another's transaction was
open, and then exits, left its batch PrepareCommit — invisible to the workers, which read
read_committed, and hiding every later record of those partitions — for good (issue 49:
six batches created at once through ``serve``, a round wedged in 1 run of 16).

So after its commit the publisher reads its last record of each partition it wrote,
read_committed; while one is not readable it ends an offsets-only transaction (the
broker's next chance to complete its batch), at once and then after 0.1 s doubling to
2 s, for at most :data:`SETTLE_S`. On Apache Kafka the first look finds them: no
settling transaction is ever sent. Offsets-only transactions commit offsets for the
group ``batchpipe-publish-settle``, which nothing reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.produce import KafkaProducer

#: the longest a publisher waits for its batch to become visible
SETTLE_S = 10.0
FIRST_S, MAX_S = 0.1, 2.0
SETTLE_GROUP = "batchpipe-publish-settle"
#: how long one look for the last records waits
LOOK_S = 0.5


def settle(
    kafka: KafkaConfig,
    producer: KafkaProducer,
    last: Mapping[tuple[str, int], int],
    timeout_s: float = SETTLE_S,
) -> bool:
    """Once ``producer`` committed a transaction whose last record on each partition is
    ``last[(topic, partition)]``: True when all are readable read_committed, after as few
    offsets-only transactions as that took; False after ``timeout_s`` (its batch is then
    committed but held back by a transaction that has not ended, a killed publisher's:
    the embedded broker never ends it)."""
    if not last:
        return True
    reader = clients.consumer(kafka, SETTLE_GROUP, read_committed=True)
    try:
        deadline = time.monotonic() + timeout_s
        wait = FIRST_S
        left = dict(last)
        while True:
            left = _unread(reader, left)
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            producer.begin_transaction()
            offsets = [TopicPartition(t, p, o + 1) for (t, p), o in sorted(left.items())]
            producer.send_offsets_to_transaction(offsets, reader.consumer_group_metadata())
            producer.commit_transaction(max(1.0, deadline - time.monotonic()))
            time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
            wait = min(MAX_S, wait * 2)
    finally:
        reader.close()


def _unread(reader: Consumer, left: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Of ``left``, the last records a read_committed reader cannot read yet."""
    reader.assign([TopicPartition(t, p, o) for (t, p), o in left.items()])
    unread = dict(left)
    deadline = time.monotonic() + LOOK_S
    while unread and time.monotonic() < deadline:
        for m in reader.consume(100, timeout=0.05):
            if m.error() is not None:
                continue
            at = (m.topic() or "", m.partition() or 0)
            offset = m.offset()
            if at in unread and offset is not None and offset >= unread[at]:
                del unread[at]
    reader.unassign()
    return unread
