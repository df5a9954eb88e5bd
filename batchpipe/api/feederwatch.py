"""Whether a feeder moves this server's pending topics (``scheduling.fair``, §10).

With fair share on, ``serve`` publishes a batch to ``<requests_topic>.pending``, and only a
worker's feeder (a worker with ``scheduling.fair: true``) moves it on. A fleet started with
mismatched settings would leave the batch ``in_progress`` for ever, saying nothing. The
feeder that holds a pending partition writes a heartbeat to its state topic every 10 s
(:mod:`worker.feeder.state`); this reads those heartbeats, one thread, and says
:meth:`FeederWatch.stalled` once none came for :data:`NO_FEEDER_S`: ``/readyz`` shows it
(still ready: a fleet scaled to zero must keep its API up to be scaled up again), and the
lifecycle ends a batch that has had no answer in that time ``failed`` with
:data:`NO_FEEDER_CODE`, naming the setting.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import TopicPartition

from worker.config import Config
from worker.feeder.naming import pending_topic, state_topic
from worker.feeder.state import ALIVE_KEY, alive_at
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

log = logging.getLogger("batchpipe.api")

NO_FEEDER_S = 60.0
NO_FEEDER_CODE = "no_feeder"


class FeederWatch:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._fair = config.scheduling.fair
        self._topic = config.kafka.requests_topic
        self._since = time.time()  # no heartbeat counts from when this server started
        self._beat: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-feeder-watch", daemon=True)

    def start(self) -> None:
        if self._fair:
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def stalled(self, now: float) -> str | None:
        """Why no batch of this server can move, or None while a feeder is alive (or fair
        share is off: batches then go straight to the requests topic)."""
        if not self._fair:
            return None
        last = self._beat if self._beat is not None else self._since
        if now - last < NO_FEEDER_S:
            return None
        return (
            f"no feeder alive for {pending_topic(self._topic)} in {NO_FEEDER_S:g} s: this "
            "server publishes with scheduling.fair: true, so batches wait for a worker with "
            "scheduling.fair: true (or set scheduling.fair: false on this server)"
        )

    def _run(self) -> None:
        kafka = self._config.kafka
        consumer = clients.consumer(kafka, f"{kafka.group_id}.api-feeders")
        try:
            topic = state_topic(self._topic)
            clients.ensure_topics(kafka, [topic], partitions=1, compacted=True)
            consumer.assign([TopicPartition(topic, 0, FROM_START)])
            while not self._stop.is_set():
                msg = consumer.poll(0.5)
                if msg is None or msg.error() is not None or msg.key() != ALIVE_KEY:
                    continue
                at = alive_at(msg.value())
                if at is not None and (self._beat is None or at > self._beat):
                    self._beat = at
        except Exception:
            log.exception("feeder watch stopped; /readyz will say no feeder is alive")
        finally:
            consumer.close()
