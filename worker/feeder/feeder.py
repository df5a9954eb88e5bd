"""The feeder role of a worker: one thread, one member of the fleet's feeder group.

With ``scheduling.fair`` on, every ``batchpipe worker`` runs a :class:`Feeder` beside its
loop. All of them join the group ``<group_id>.feeder`` on the one-partition pending topic,
so exactly one holds it and moves batches (:class:`~worker.feeder.mover.Mover`); the
others stand by and take over on a rebalance. The thread shares nothing with the worker
loop but the metrics registry: its own consumers and its own transactional producer.

A Kafka failure while moving drops the mover and, after :data:`RETRY_S`, the feeder
rejoins and rebuilds it from Kafka: nothing it held in memory is needed to go on.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry

from worker.config import Config
from worker.feeder.gaps import GapGuard
from worker.feeder.metrics import FeederMetrics
from worker.feeder.mover import Mover
from worker.feeder.naming import ensure_pending, pending_topic, state_topic
from worker.feeder.sweep import FeederError
from worker.kafka import clients
from worker.kafka.consumer import KafkaConsumer

log = logging.getLogger(__name__)

RETRY_S = 1.0
#: how long a scan waits for new pending records when there is nothing to move
IDLE_POLL_S = 0.05
#: the most a scan reads between two feed steps
SCAN_TURN_RECORDS = 20_000
SCAN_TURN_S = 0.05
#: how long the scan waits before it reads a hole in the pending offsets again
#: (:mod:`worker.feeder.gaps`): the broker stores the missing batch within it
REREAD_S = 0.02


class Feeder:
    def __init__(self, config: Config, registry: CollectorRegistry) -> None:
        self._config = config
        self._metrics = FeederMetrics(registry)
        self._mover: Mover | None = None
        self._gaps = GapGuard()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batchpipe-feeder", daemon=True)

    def start(self) -> None:
        k = self._config.kafka
        ensure_pending(k, self._config.limits, [k.requests_topic])
        clients.ensure_topics(k, [state_topic(k.requests_topic)], partitions=1, compacted=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def owner(self) -> bool:
        """Whether this worker's feeder holds the pending partition now."""
        return self._mover is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve()
            except (KafkaException, FeederError) as exc:
                log.warning("feeder: %s; rejoining in %.0f s", exc, RETRY_S)
                self._stop.wait(RETRY_S)
            except Exception:
                # a bug must not end the fleet's feeding for good: this member leaves the
                # group (another takes the partition), says why, and joins again
                log.exception("feeder failed; rejoining in %.0f s", RETRY_S)
                self._stop.wait(RETRY_S)

    def _serve(self) -> None:
        k = self._config.kafka
        scan = clients.consumer(k, f"{k.group_id}.feeder")
        try:
            scan.subscribe(
                [pending_topic(k.requests_topic)],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )
            paused = False
            while not self._stop.is_set():
                mover = self._mover
                busy = mover is not None and len(mover.fair) > 0
                full = mover is not None and mover.index.full
                if full != paused:  # the index's bound: scan again once feeding freed room
                    (scan.pause if full else scan.resume)(scan.assignment())
                    paused = full
                records = self._scan_turn(scan, 0.0 if busy or paused else IDLE_POLL_S)
                good, again = self._gaps.admit([m for m in records if _checked(m)])
                if again is not None:
                    self._stop.wait(REREAD_S)
                    scan.seek(TopicPartition(pending_topic(k.requests_topic), 0, again))
                mover = self._mover  # a rebalance inside consume may have changed it
                if mover is not None:
                    mover.note(good)
                    if not mover.feed() and busy:
                        self._stop.wait(0.002)  # full: let the workers answer
        finally:
            self._drop()
            scan.close()

    def _scan_turn(self, scan: Consumer, timeout: float) -> list[Message]:
        """What the scan reads before the next feed step: while records keep coming, up
        to :data:`SCAN_TURN_RECORDS` or :data:`SCAN_TURN_S`, so a burst is indexed at
        the consumer's pace, not 500 records per feed step (issue 38: a 10M-record burst
        took minutes to index)."""
        records = list(scan.consume(500, timeout=timeout))
        deadline = time.monotonic() + SCAN_TURN_S
        while records and len(records) < SCAN_TURN_RECORDS and time.monotonic() < deadline:
            more = scan.consume(500, timeout=0.0)
            if not more:
                break
            records.extend(more)
        return records

    def _on_assign(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        self._drop()
        self._mover = Mover(self._config, consumer, self._metrics)
        self._gaps.reset(self._mover.index.frontier)
        self._metrics.owner(True)
        log.info(
            "feeder: moving %s from offset %d", partitions[0].topic, self._mover.index.frontier
        )

    def _on_revoke(self, _consumer: KafkaConsumer, _partitions: list[TopicPartition]) -> None:
        self._drop()

    def _drop(self) -> None:
        mover, self._mover = self._mover, None
        self._metrics.owner(False)
        if mover is not None:
            mover.close()


def _checked(m: Message) -> bool:
    error = m.error()
    if error is None:
        return True
    if error.fatal():
        raise KafkaException(error)
    if error.code() != KafkaError._PARTITION_EOF:
        log.warning("feeder: consumer error: %s", error)
    return False
