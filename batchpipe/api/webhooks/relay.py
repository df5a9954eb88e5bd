"""The events topic: each change of a batch's state, exactly once, and the webhooks owed.

Every change of a batch's state is one new version of its record on the state topic
(:mod:`batchpipe.api.state`; a create, and each change of ``status``). The relay reads
that topic in a consumer group of its own (``<kafka.group_id>.api-events``): the topic
has one partition, so one replica of ``serve`` relays and delivers at a time, and the
next one takes over when it stops. For each record it reads it writes the event
(:func:`~.signing.event_of`, key the batch id) to ``<kafka.results_topic>.events``
and, for an end its owner's endpoint wants, the delivery owed to
``<kafka.state_topic>.webhooks`` (:mod:`.deliveries`) — both in one Kafka transaction
with its consumer offset (``transactional.id`` ``<group_id>.api-events.<state topic>``:
a new owner fences the previous one). A crash before the commit leaves none of them,
after it all, so a read_committed reader sees exactly one event per change of state.
Two versions with one status (two replicas racing on one change; one is refused but
may have landed) give one event, as long as one relay reads both.

Kafka failing under the relay (a transaction that cannot start, say) makes it leave the
group and join again :data:`_REJOIN_S` later; another replica may relay meanwhile.

An end older than ``api.webhook_give_up_after_s`` when relayed (the relay's first run
over an existing state topic) is written to the events topic but not delivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from batchpipe.api.records import BatchRecord
from batchpipe.api.webhooks.deliveries import Deliverer, Pending
from batchpipe.api.webhooks.endpoints import Endpoint
from batchpipe.api.webhooks.signing import event_of
from worker.config import Config, KafkaConfig
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

log = logging.getLogger("batchpipe.api.webhooks")

_TXN_TIMEOUT_S = 30.0
_READ = 500  # records a transaction covers at most
_REJOIN_S = 5.0
_INIT_STEP_S = 0.5


def events_topic(kafka: KafkaConfig) -> str:
    return f"{kafka.results_topic}.events"


def deliveries_topic(kafka: KafkaConfig) -> str:
    return f"{kafka.state_topic}.webhooks"


class KafkaDeliveryLog:
    """Delivery state on the compacted deliveries topic (:class:`~.deliveries.DeliveryLog`)."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self._kafka = kafka
        self._topic = deliveries_topic(kafka)
        self._producer = clients.producer(kafka)

    def close(self) -> None:
        self._producer.flush(10)

    def _write(self, key: str, value: bytes | None) -> None:
        self._producer.produce(self._topic, key=key.encode(), value=value)
        if self._producer.flush(10) > 0:
            raise KafkaException(
                KafkaError(KafkaError._MSG_TIMED_OUT, f"{self._topic}: no verdict")
            )

    def put(self, pending: Pending) -> None:
        self._write(pending.webhook_id, pending.encode())

    def done(self, webhook_id: str) -> None:
        self._write(webhook_id, None)

    def load(self) -> list[Pending]:
        """Every delivery owed, read (read_committed) to the topic's end."""
        consumer = clients.consumer(
            self._kafka,
            f"{self._kafka.group_id}.api-webhooks",
            extra={"enable.partition.eof": True},
        )
        owed: dict[str, Pending] = {}
        try:
            consumer.assign([TopicPartition(self._topic, 0, FROM_START)])
            while True:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return list(owed.values())
                    raise KafkaException(error)
                key, value = (msg.key() or b"").decode(), msg.value()
                if value is None:
                    owed.pop(key, None)
                else:
                    owed[key] = Pending.decode(value)
        finally:
            consumer.close()


class EventRelay:
    def __init__(
        self, config: Config, endpoints: Mapping[str, Endpoint], deliverer: Deliverer
    ) -> None:
        self._config = config
        self._kafka = config.kafka
        self._endpoints = endpoints
        self._deliverer = deliverer
        self._producer: Producer | None = None
        self._seen: dict[str, str] = {}  # batch id -> the status last relayed
        self._takeover_failed: KafkaException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-events", daemon=True)

    def start(self) -> None:
        kafka = self._kafka
        clients.ensure_topics(kafka, [events_topic(kafka)])
        clients.ensure_topics(kafka, [deliveries_topic(kafka)], partitions=1, compacted=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(90)

    @property
    def owner(self) -> bool:
        """This replica relays and delivers now."""
        return self._producer is not None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._membership()
            except Exception as exc:  # Kafka failing under the relay (init_transactions
                # timing out, say): leave the group, and join it again in a while
                if not self._stop.is_set():
                    log.warning("relaying batch events failed, joining again: %r", exc)
                self._revoked(None, [])
                self._stop.wait(_REJOIN_S)

    def _membership(self) -> None:
        """One membership of the relay's group, until the relay stops or Kafka fails."""
        consumer = clients.consumer(self._kafka, f"{self._kafka.group_id}.api-events")
        consumer.subscribe(
            [self._kafka.state_topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )
        self._takeover_failed = None
        try:
            while not self._stop.is_set():
                messages = consumer.consume(_READ, 0.2)
                if self._takeover_failed is not None:
                    raise self._takeover_failed
                if messages and self._producer is not None:
                    self._relay(consumer, self._producer, messages)
        finally:
            try:
                consumer.close()  # revokes: the deliverer lets go first
            except KafkaException as exc:
                log.warning("the relay's consumer did not leave its group cleanly: %s", exc)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        # nothing may escape a rebalance callback: librdkafka hands it back mangled (a
        # bare KafkaError no except clause catches), so a failure is raised by the loop
        try:
            transactional_id = f"{self._kafka.group_id}.api-events.{self._kafka.state_topic}"
            producer = clients.producer(self._kafka, transactional_id=transactional_id)
            self._init_transactions(producer)  # fences the previous owner
            self._deliverer.resume()
        except KafkaException as exc:
            self._takeover_failed = exc
            return
        self._seen.clear()
        self._producer = producer
        log.info("this replica relays batch events and delivers webhooks")

    def _init_transactions(self, producer: Producer) -> None:
        """``init_transactions`` in short steps (each resumes the last), so that a stop
        never waits out its whole timeout while Kafka is down."""
        deadline = time.monotonic() + _TXN_TIMEOUT_S
        while True:
            try:
                producer.init_transactions(_INIT_STEP_S)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if self._stop.is_set() or time.monotonic() > deadline or not error.retriable():
                    raise

    def _revoked(self, consumer: Consumer | None, partitions: list[TopicPartition]) -> None:
        if self._producer is None:
            return
        self._deliverer.release()
        self._producer = None

    def _relay(self, consumer: Consumer, producer: Producer, messages: list[Message]) -> None:
        seen = dict(self._seen)
        owed: list[Pending] = []
        producer.begin_transaction()
        try:
            for msg in messages:
                if msg.error() is None:
                    owed += self._one(producer, msg, seen)
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()),
                consumer.consumer_group_metadata(),
                _TXN_TIMEOUT_S,
            )
            producer.commit_transaction(_TXN_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("relaying batch events failed, reading them again: %s", exc)
            try:
                producer.abort_transaction(_TXN_TIMEOUT_S)
            except KafkaException:  # fenced: another replica relays now
                self._revoked(consumer, [])
                return
            first = messages[0]
            where = TopicPartition(str(first.topic()), first.partition() or 0, first.offset() or 0)
            consumer.seek(where)
            return
        self._seen = seen
        self._deliverer.take(owed)

    def _one(self, producer: Producer, msg: Message, seen: dict[str, str]) -> list[Pending]:
        kind, _, batch_id = (msg.key() or b"").decode().partition(":")
        value = msg.value()
        if kind != "batch" or value is None:
            return []
        batch = BatchRecord.decode(value)
        if seen.get(batch_id) == batch.status:
            return []
        seen[batch_id] = batch.status
        event = event_of(batch)
        body = event.body()
        producer.produce(events_topic(self._kafka), key=batch_id.encode(), value=body)
        endpoint = self._endpoints.get(batch.owner)
        now = time.time()
        if (
            endpoint is None
            or event.type not in endpoint.events
            or now - event.created_at >= self._config.api.webhook_give_up_after_s
        ):
            return []
        pending = Pending(event.webhook_id, batch.owner, event.type, body.decode(), now, 0, now)
        producer.produce(deliveries_topic(self._kafka), key=pending.webhook_id.encode(),
                         value=pending.encode())  # fmt: skip
        return [pending]
