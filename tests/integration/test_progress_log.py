"""The progress topic on a real broker (issue 48, docs/architecture.md §2 "Answers on
completion"): answers above a partition's committed offset are published at once, and the
partition's next owner learns from the record the group's pointer names which to skip; a
fenced producer's progress record is written but never pointed at.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from uuid import uuid4

import pytest
from confluent_kafka import TopicPartition

from batcher import OffsetTracker, Partition, Progress
from tests.integration.harness import read_topic
from worker.config import Config, KafkaConfig
from worker.kafka import clients
from worker.kafka.committer import Committer, Handover
from worker.kafka.failures import GenerationLost
from worker.kafka.progress import KafkaProgressLog, progress_topic, record
from worker.kafka.publisher import Outgoing
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import TransactionalPublisher
from worker.wire.progress import decode_progress

pytestmark = pytest.mark.integration


def _topics(kafka_config: Config) -> KafkaConfig:
    k = replace(kafka_config.kafka, partitions=1)
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, progress_topic(k.requests_topic)])
    return k


def _publisher(k: KafkaConfig, tracker: OffsetTracker, prefix: str) -> TransactionalPublisher:
    return TransactionalPublisher(
        k,
        clients.consumer(k),
        tracker,
        clients.Producers(k, 1_000_000),
        prefix,
        BrokerStableCheck(k),
        progress=KafkaProgressLog(k, 1),
    )


def _pointer(k: KafkaConfig) -> int:
    consumer = clients.consumer(k)
    try:
        (tp,) = consumer.committed([TopicPartition(progress_topic(k.requests_topic), 0)], 15)
        return int(tp.offset)
    finally:
        consumer.close()


def test_the_next_owner_skips_what_was_answered_above_the_commit(kafka_config: Config) -> None:
    k = _topics(kafka_config)
    origin: Partition = (k.requests_topic, 0)
    prefix = f"progress-{uuid4()}"
    tracker = OffsetTracker()
    first = _publisher(k, tracker, prefix)
    first.assign([origin])
    for offset in range(5):
        tracker.add(origin, offset)
    for offset in (1, 2, 4):  # 0 and 3 still run
        done = partial(tracker.done, origin, offset)
        first.send(k.results_topic, f"id-{offset}", b"answer", [], origin, done, offset)
    first.revoke([origin])  # a clean hand-over: commits the answers and the progress
    assert sorted(m.key() or b"" for m in read_topic(kafka_config, k.results_topic, 3)) == [
        b"id-1",
        b"id-2",
        b"id-4",
    ]
    assert _pointer(k) > 0

    nxt = OffsetTracker()
    second = _publisher(k, nxt, prefix)
    try:
        second.assign([origin])
        (start,) = second.resume([origin], 15)
        assert (start.topic, start.partition, start.offset) == (*origin, 0)
        assert nxt.progress(origin) == Progress(committed=0, highest=4, unanswered=(0, 3))
        assert [nxt.add(origin, o) for o in range(6)] == [True, False, False, True, False, True]
    finally:
        second.close()


def test_a_fenced_producers_progress_record_is_never_pointed_at(kafka_config: Config) -> None:
    k = _topics(kafka_config)
    origin: Partition = (k.requests_topic, 0)
    txn_id = f"zombie-{uuid4()}"
    producers = clients.Producers(k, 1_000_000)
    consumer = clients.consumer(k)
    outcomes: list[str] = []
    zombie = Committer(producers(txn_id), txn_id, outcomes.append)

    def handover(progress: Progress) -> Handover:
        return Handover(
            records=(Outgoing(k.results_topic, "id-0", b"answer", ()),),
            origins=frozenset([origin]),
            offsets=(TopicPartition(*origin, progress.committed),),
            metadata=consumer.consumer_group_metadata(),
            progress=(record(k.group_id, origin, progress),),
            progress_topic=progress_topic(k.requests_topic),
        )

    try:
        zombie.hand(handover(Progress(0, 0)))
        (pointer,) = zombie.outcome()
        assert pointer.offset == _pointer(k) > 0
        # the partition's next owner claims the id: the old producer is fenced
        successor = producers(txn_id)
        successor.init_transactions(15)
        zombie.hand(handover(Progress(1, 5, (2,))))
        with pytest.raises(GenerationLost):
            zombie.outcome()
        assert _pointer(k) == pointer.offset  # the zombie's record is not the one named
        log = KafkaProgressLog(k, 1)
        value = log.read({origin: pointer.offset - 1})[origin]
        assert decode_progress(k.group_id, origin, value) == Progress(0, 0)
    finally:
        zombie.close(flush=False)
        consumer.close()
