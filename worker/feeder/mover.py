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

Within a step the slices are acknowledged by the broker *before* the state records are
produced. On Apache Kafka an aborted step hides both, so the order does not matter there;
but the embedded broker (Tansu) shows read_committed readers the records of aborted
transactions too. A feeder killed mid-step, with its state record on the broker and part
of its slice still in librdkafka's queue, left a ``fed_to`` that the next feeder believed
over requests that were never written: measured, 22 requests lost in one takeover. With
the slices acknowledged first, a visible ``fed_to`` always covers written requests; a
step cut short before its state is written is fed again, and readers keep one answer per
``custom_id`` (§2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from batcher.tiers import FLEX, Tiers, priority_share
from worker.config import Config, producer_max_bytes
from worker.feeder import state
from worker.feeder.credits import Credits
from worker.feeder.demand import DemandReader
from worker.feeder.forward import forward
from worker.feeder.headers import Charging
from worker.feeder.index import PendingIndex
from worker.feeder.metrics import FeederMetrics
from worker.feeder.naming import pending_topic, state_topic
from worker.feeder.plan import Planner, Step
from worker.feeder.readahead import ReadAhead
from worker.feeder.stall import StallWatch
from worker.feeder.stops import Drain
from worker.feeder.trim import Trim
from worker.kafka import clients
from worker.kafka.cancellations import Cancellations, TopicReader
from worker.kafka.consumer import KafkaConsumer, resume_points

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
#: the most records one step moves (one transaction)
STEP_MAX = 512


class Mover:
    def __init__(self, config: Config, scan: KafkaConsumer, metrics: FeederMetrics) -> None:
        k = config.kafka
        self._scan = scan
        self._metrics = metrics
        self._requests = k.requests_topic
        self._dead_letters = k.dead_letter_topic
        self._control = k.control_topic
        self._pending = pending_topic(k.requests_topic)
        self._state = state_topic(k.requests_topic)
        self._producer = clients.producer(
            k,
            transactional_id=f"batchpipe.{k.group_id}.feeder",
            extra={"message.max.bytes": producer_max_bytes(k, config.limits)},
        )
        # fencing first: the feeder that held the partition before, if it still runs, can
        # commit nothing from here on, so the state and offset read next stay true
        self._producer.init_transactions(TIMEOUT_S)
        (start,) = resume_points(scan, [(self._pending, 0)], TIMEOUT_S)
        scan.assign([start])
        self.index = PendingIndex(state.read_state(k, self._state), start.offset)
        shares = config.scheduling.priority_shares
        self.fair = Tiers(config.scheduling.quantum, lambda key: priority_share(shares, key))
        self._reader = clients.consumer(k, f"{k.group_id}.feeder-reader")
        self.ahead = ReadAhead(self._reader, self._pending, self.index)
        self.drain = Drain(Cancellations(TopicReader(k)), self.fair, self.index)
        self.planner = Planner(
            self.index,
            self.fair,
            self.ahead,
            self.drain,
            Charging.from_config(config),
            engine=config.batching.max_batch_size,
        )
        self._alive_sent, self._alive = 0.0, b""
        self._undelivered = 0  # slice records the broker refused in this step
        self.trim = Trim(clients.admin(k), self._pending, metrics.trimmed)
        # what each worker can take, from its demand reports (worker/feeder/credits.py)
        self._batch = config.batching.prefetch_count
        self.credits = Credits(self._batch, engine=config.batching.max_batch_size)
        self._demand = DemandReader(k)
        self._stall = StallWatch()

    def close(self) -> None:
        self.drain.close()
        self._reader.close()
        self._demand.close()
        self._producer.flush(TIMEOUT_S)

    def note(self, records: Sequence[Message]) -> None:
        """Index records the group consumer scanned from the pending partition, keeping
        what the read-ahead has room for."""
        self.planner.note(records)
        self._metrics.active(len(self.fair))
        self._metrics.tiers(self.fair.waiting_by_tier, {})

    def feed(self) -> int:
        """Move what fair share chooses and the workers' credits allow; returns how many
        moved."""
        self._demand.poll(self.credits.report)
        room = self.credits.room()
        unread = self.credits.unread()
        self._metrics.depth(unread, unread + room)
        self.trim.poll()
        # stopped batches: outside shares and credits; a newly active batch's first slice
        # may exceed the credit, by at most one batch unread a worker (newcomers first, §10)
        fresh = self.credits.overdraft()
        flex_room = self.credits.room(cushion=False)  # flex keeps nothing unread (tiers)
        step = self.planner.plan(room, STEP_MAX, fresh, self.credits.rate(), flex_room)
        # flex waits by design while nothing else has room (batcher/tiers.py): not a stall
        waiting = sum(n for tier, n in self.fair.waiting_by_tier.items() if tier != FLEX)
        stalled = self._stall.step(waiting, step.shared, self.credits.idle)
        if stalled is not None:
            log.warning(
                "feeder: %d requests waiting and none fed for %.0f s with free slots "
                "(room %d, beyond credit %d): %s",
                waiting,
                stalled,
                room,
                fresh,
                self.credits.describe(),
            )
        if not step.slices and not step.stops and not step.abandoned:
            if self._alive_due():  # idle or full: serve still sees a feeder
                self._producer.begin_transaction()
                self._producer.produce(self._state, key=state.ALIVE_KEY, value=self._alive)
                self._producer.commit_transaction(TIMEOUT_S)
            return 0
        self._commit(step, room)
        moved = step.moved
        self._metrics.fed(moved)
        self._metrics.tiers(self.fair.waiting_by_tier, step.by_tier)
        self._metrics.active(len(self.fair))
        self._metrics.quarantined(len(step.stops), sum(step.abandoned.values()))
        return moved

    def _commit(self, step: Step, room: int) -> None:
        p = self._producer
        p.begin_transaction()
        self._undelivered = 0
        for stop in step.stops:  # workers answer the batch 4007 (worker/feeder/plan.py)
            p.produce(self._control, key=stop.batch_id.encode(), value=stop.encode())
        # each to a worker with credit; a newcomer's first slice beyond it
        overdrawn = max(0, step.shared - room)
        placed = self.credits.place(step.shared, over=overdrawn, front=step.front)
        for _, records in step.slices[: step.drains]:  # answered at admission by any reader
            for m in records:
                forward(p, self._requests, self._dead_letters, m, self._drained)
        # each request its own tag, written lowest first; the workers start the lowest
        # of what they hold first (§10)
        for m, tag, partition, over in step.written(placed, self.credits.beyond, overdrawn):
            done = self._delivered_over if over else self._delivered
            if (
                not forward(p, self._requests, self._dead_letters, m, done, partition, tag)
                and partition is not None
            ):
                self.credits.returned(partition, over)
        # the slices on the broker before the state that says they were fed (module doc)
        if p.flush(TIMEOUT_S) > 0 or self._undelivered:
            raise KafkaException(
                KafkaError(KafkaError._MSG_TIMED_OUT, "a slice was not acknowledged")
            )
        for batch_id in step.fed:
            p.produce(
                self._state, key=batch_id.encode(), value=state.encode(self.index.fed_to[batch_id])
            )
        if self._alive_due():
            p.produce(self._state, key=state.ALIVE_KEY, value=self._alive)
        low = self.index.low_water()
        for batch_id in self.index.retire(low):
            p.produce(self._state, key=batch_id.encode(), value=None)
        offsets = [TopicPartition(self._pending, 0, low)]
        p.send_offsets_to_transaction(offsets, self._scan.consumer_group_metadata(), TIMEOUT_S)
        p.commit_transaction(TIMEOUT_S)
        p.poll(0)
        self.trim.committed(low)  # everything below it was fed: the broker may delete it

    def _alive_due(self) -> bool:
        """Whether the heartbeat is due (and then its value is in ``_alive``)."""
        now = time.time()
        if now - self._alive_sent < state.ALIVE_EVERY_S:
            return False
        self._alive_sent, self._alive = now, state.alive(now)
        return True

    def _delivered(self, error: KafkaError | None, msg: Message, over: bool = False) -> None:
        partition, offset = msg.partition(), msg.offset()
        if error is not None:
            self._undelivered += 1
        elif partition is not None and offset is not None:
            self.credits.delivered(partition, offset, over)

    def _delivered_over(self, error: KafkaError | None, msg: Message) -> None:
        """A record fed beyond credit was acknowledged (or not)."""
        self._delivered(error, msg, over=True)

    def _drained(self, error: KafkaError | None, _msg: Message) -> None:
        if error is not None:
            self._undelivered += 1
