"""Where the worker gets its Kafka clients: topics, a consumer, a publisher.

:class:`~worker.loop.service.Worker` never builds a client itself; it asks a
:class:`KafkaClients`. The default, :class:`ConfluentClients`, builds confluent-kafka
clients from :class:`~worker.config.KafkaConfig`; the unit tests pass in-memory fakes
and drive the worker loop without a broker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace

from batcher import OffsetTracker
from worker.config import KafkaConfig, LimitsConfig
from worker.kafka import clients
from worker.kafka.cancellations import ControlReader, TopicReader
from worker.kafka.consumer import KafkaConsumer
from worker.kafka.outcome import TxOutcome
from worker.kafka.progress import KafkaProgressLog, progress_topic
from worker.kafka.publisher import AtLeastOncePublisher, Publisher
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import TransactionalPublisher

#: called with the outcome of every transaction that ends
OnOutcome = Callable[[TxOutcome], None]


class KafkaClients(ABC):
    """Everything the worker needs from Kafka, for one :class:`KafkaConfig`."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka

    @abstractmethod
    def ensure_topics(self, topics: Sequence[str]) -> None:
        """Create those of ``topics`` that do not exist yet, and learn how large a record
        each takes (a topic's ``max.message.bytes`` may be below the producers' limit)."""

    @abstractmethod
    def consumer(self) -> KafkaConsumer:
        """A consumer of ``kafka.group_id`` that commits only when told; not subscribed."""

    @abstractmethod
    def offsets(self) -> KafkaConsumer:
        """A consumer of ``kafka.group_id`` for offset queries only (end offsets, committed
        offsets), never subscribed: a connection of its own, so that a slow query never
        waits in line before the worker's fetches and commits."""

    @abstractmethod
    def publisher(
        self, consumer: KafkaConsumer, tracker: OffsetTracker, on_outcome: OnOutcome
    ) -> Publisher:
        """The publisher of ``kafka.delivery``, committing ``tracker``'s offsets."""

    @abstractmethod
    def control(self) -> ControlReader:
        """A reader of the control topic (stopped batches) from its beginning."""


class ConfluentClients(KafkaClients):
    """The real clients: confluent-kafka (librdkafka) against ``kafka.bootstrap_servers``;
    producers take records up to :func:`~worker.config.producer_max_bytes` of ``limits``."""

    def __init__(self, kafka: KafkaConfig, limits: LimitsConfig) -> None:
        super().__init__(kafka)
        self.producers = clients.Producers.of(kafka, limits)

    def ensure_topics(self, topics: Sequence[str]) -> None:
        clients.ensure_topics(
            self.kafka, topics, max_message_bytes=self.producers.max_message_bytes
        )
        topic_max = clients.topic_max_bytes(self.kafka, topics)
        self.producers = replace(self.producers, topic_max=topic_max)

    def consumer(self) -> KafkaConsumer:
        return clients.consumer(self.kafka)

    def offsets(self) -> KafkaConsumer:
        return clients.consumer(self.kafka)

    def publisher(
        self, consumer: KafkaConsumer, tracker: OffsetTracker, on_outcome: OnOutcome
    ) -> Publisher:
        k = self.kafka
        if k.delivery == "exactly_once":
            prefix = f"batchpipe.{k.group_id}"
            topic = progress_topic(k.requests_topic)
            # partition for partition: the progress topic as wide as the requests topic
            # compacted: each group's latest record of each partition is the one kept
            count = clients.partition_count(k, k.requests_topic)
            clients.ensure_topics(k, [topic], count, compacted=True)
            progress = KafkaProgressLog(k, clients.partition_count(k, topic))
            stable = BrokerStableCheck(k)
            return TransactionalPublisher(
                k, consumer, tracker, self.producers, prefix, stable, on_outcome, progress
            )
        return AtLeastOncePublisher(k, consumer, tracker, self.producers)

    def control(self) -> ControlReader:
        return TopicReader(self.kafka)
