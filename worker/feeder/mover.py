"""What a feeder does while it holds the pending partition: index, choose, move, commit.

One :class:`Mover` lives from an assignment of the pending partition to its revocation.
It is built from Kafka alone — the state topic and the pending partition's committed
offset — so a feeder on another worker, after a rebalance or a crash, resumes exactly
where the last committed step left off.

Each :meth:`Mover.feed` is one Kafka transaction: the slices chosen by
:class:`batcher.fairshare.FairShare`, produced to the requests topic; each fed batch's new
``fed_to`` to the state topic (tombstones for batches no feeder will scan again); and the
pending partition's offset, the lowest record still to be fed, committed for the feeder
group. Either all of a step becomes visible or none of it. Any Kafka failure ends the
mover: the feeder drops it and builds a new one from Kafka (:mod:`worker.feeder.feeder`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from batcher.fairshare import FairShare
from worker.config import Config, producer_max_bytes
from worker.errors import BatchpipeError
from worker.feeder import state
from worker.feeder.depth import Depth
from worker.feeder.index import PendingIndex
from worker.feeder.metrics import FeederMetrics
from worker.feeder.naming import pending_topic, scheduled_as, state_topic
from worker.kafka import clients
from worker.kafka.consumer import KafkaConsumer, resume_points

TIMEOUT_S = 30.0
#: the most records one step moves (one transaction)
STEP_MAX = 512


class FeederError(BatchpipeError, RuntimeError):
    """The mover cannot go on (a slice could not be read back); build a new one."""


class Mover:
    def __init__(self, config: Config, scan: KafkaConsumer, metrics: FeederMetrics) -> None:
        k = config.kafka
        self._scan = scan
        self._metrics = metrics
        self._requests = k.requests_topic
        self._pending = pending_topic(k.requests_topic)
        self._state = state_topic(k.requests_topic)
        (start,) = resume_points(scan, [(self._pending, 0)], TIMEOUT_S)
        scan.assign([start])
        self.index = PendingIndex(state.read_state(k, self._state), start.offset)
        self.fair = FairShare(config.scheduling.quantum)
        self._producer = clients.producer(
            k,
            transactional_id=f"batchpipe.{k.group_id}.feeder",
            extra={"message.max.bytes": producer_max_bytes(k, config.limits)},
        )
        # fences the feeder that held the partition before, if it still runs
        self._producer.init_transactions(TIMEOUT_S)
        self._reader = clients.consumer(k, f"{k.group_id}.feeder-reader")
        self._reader_at = -1  # the offset the reader reads next; -1: not assigned
        self._offsets = clients.consumer(k)  # the worker group's, for its committed offsets
        topics = self._offsets.list_topics(self._requests, timeout=TIMEOUT_S).topics
        partitions = len(topics[self._requests].partitions)
        self.depth = Depth(
            self._offsets,
            self._requests,
            partitions,
            config.scheduling,
            config.batching.prefetch_count,
        )

    def close(self) -> None:
        self._reader.close()
        self._offsets.close()
        self._producer.flush(TIMEOUT_S)

    def note(self, records: Sequence[Message]) -> None:
        """Index records the group consumer scanned from the pending partition."""
        for m in records:
            offset = m.offset()
            assert offset is not None
            batch_id, weight = scheduled_as(m.headers())
            if self.index.scan(offset, batch_id, weight):
                self.fair.add(batch_id, 1, self.index.batches[batch_id].weight)
        self._metrics.active(len(self.fair))

    def feed(self) -> int:
        """Move what fair share chooses and the depth allows; returns how many moved."""
        room = min(self.depth.room(), STEP_MAX)
        self._metrics.depth(self.depth.depth, self.depth.limit)
        if room <= 0 or not len(self.fair):
            return 0
        slices: list[tuple[str, list[Message]]] = []
        while room > 0 and (picked := self.fair.next(room)) is not None:
            batch_id, count = picked
            slices.append((batch_id, self._read(batch_id, count)))
            room -= count
        self._commit(slices)
        moved = sum(len(records) for _, records in slices)
        self.depth.fed(moved)
        self._metrics.fed(moved)
        self._metrics.active(len(self.fair))
        return moved

    def _read(self, batch_id: str, count: int) -> list[Message]:
        """The next ``count`` records of ``batch_id``, marked fed in the index."""
        taken: list[Message] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(taken) < count:
            cursor = self.index.cursor(batch_id)
            if self._reader_at != cursor:
                self._reader.assign([TopicPartition(self._pending, 0, cursor)])
                self._reader_at = cursor
            run = self.index.batches[batch_id].runs[0]
            want = min(count - len(taken), run.count)
            for m in self._reader.consume(want, timeout=0.1):
                if m.error() is not None:
                    error = m.error()
                    assert error is not None
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                offset = m.offset()
                assert offset is not None
                self._reader_at = offset + 1
                if offset < run.start or offset >= run.end or len(taken) == count:
                    continue  # before the cursor (a stale fetch) or past this run
                taken.append(m)
                self.index.fed(batch_id, offset)
                if batch_id not in self.index.batches:
                    break
                run = self.index.batches[batch_id].runs[0]
            if time.monotonic() > deadline:
                raise FeederError(f"{batch_id}: {len(taken)} of {count} records read back")
        return taken

    def _commit(self, slices: list[tuple[str, list[Message]]]) -> None:
        p = self._producer
        p.begin_transaction()
        for _, records in slices:
            for m in records:
                p.produce(
                    self._requests,
                    value=m.value(),
                    key=m.key(),
                    headers=m.headers(),
                    on_delivery=self._delivered,
                )
        for batch_id in dict.fromkeys(b for b, _ in slices):
            p.produce(
                self._state, key=batch_id.encode(), value=state.encode(self.index.fed_to[batch_id])
            )
        low = self.index.low_water()
        for batch_id in self.index.retire(low):
            p.produce(self._state, key=batch_id.encode(), value=None)
        offsets = [TopicPartition(self._pending, 0, low)]
        p.send_offsets_to_transaction(offsets, self._scan.consumer_group_metadata(), TIMEOUT_S)
        p.commit_transaction(TIMEOUT_S)
        p.poll(0)

    def _delivered(self, error: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if error is None and partition is not None and offset is not None:
            self.depth.delivered(partition, offset)
