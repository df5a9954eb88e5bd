"""Kafka clients, configured in one place, and topic creation.

Every process (worker, submit, collect, status) builds its clients here so that they
find the broker and topics exactly alike. Raw librdkafka settings from
``kafka.client`` are applied last and win over everything set here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from worker.config import TRANSACTION_TIMEOUT_MS, KafkaConfig, LimitsConfig, producer_max_bytes
from worker.kafka.produce import BATCH_FRAMING_BYTES, RecordLimit, record_limit
from worker.wire.messages import remember

#: Group membership settings. With librdkafka's defaults a group join takes ~23 s on
#: the embedded Tansu broker; a 6 s session timeout brings it to ~3 s, and is a sane
#: value on Apache Kafka too. The worker never blocks its poll loop on the engine
#: (the engine runs on its own thread), so a short session timeout is safe.
GROUP_SETTINGS: Mapping[str, Any] = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1500,
    "max.poll.interval.ms": 300000,
}

#: how long a fetch may wait at the broker for records to arrive. Apache Kafka answers as
#: soon as a record is there; the embedded broker (Tansu) always waits the whole time
#: (§7), so librdkafka's 500 ms default there held each request back for up to half a
#: second before the worker even saw it — five times ``timeout_ms`` (issue 29). 25 ms
#: costs an idle consumer 40 empty fetches a second; ``kafka.client`` can set it back.
FETCH_WAIT_MS = 25


#: A transactional producer's settings (docs/architecture.md §2 "Offsets and exactly-once").
#: ``transaction.timeout.ms``: how long Apache Kafka lets a transaction stay open before it
#: aborts it and fences its producer. A dead worker's transaction is aborted by the next
#: owner of its partitions at once, so this bounds only how long readers wait when the whole
#: group is gone; a commit flushes its records inside the transaction, so a leader election
#: or a slow broker can hold one open for seconds, and 60 s (librdkafka's default, the one
#: the configuration check assumes; ``kafka.client`` may change it) leaves room for that
#: where 10 s did not (issue 40). ``retry.backoff.ms``: the next
#: transaction's AddPartitionsToTxn can meet CONCURRENT_TRANSACTIONS while the last one's
#: markers are written; librdkafka waits this long before it asks again (100 ms by default,
#: confluent-kafka-python #967), which back-to-back transactions would pay every time.
TRANSACTIONAL_SETTINGS: Mapping[str, Any] = {
    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
    "retry.backoff.ms": 10,
}


#: How long the worker's at-least-once producer gathers records into one request. Its
#: answers go out a batch's completions at a time, each step; at 5 ms they went out in
#: small requests that cost the embedded broker twice exactly-once's CPU per request
#: (which produces a whole commit's answers, then flushes), and at-least-once ran at
#: 0.83x exactly-once; at 25 ms, 0.95-1.03x (issue 40, bench/overhead.py). It adds up to
#: 20 ms to an at-least-once answer; ``kafka.client`` can set it back.
AT_LEAST_ONCE_LINGER_MS = 25


def _base(kafka: KafkaConfig) -> dict[str, Any]:
    return {"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3}


def _with_raw(settings: dict[str, Any], kafka: KafkaConfig) -> dict[str, Any]:
    settings.update(kafka.client)
    return settings


def consumer(
    kafka: KafkaConfig,
    group_id: str | None = None,
    *,
    read_committed: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> Consumer:
    """A consumer that commits only when told (``enable.auto.commit`` false)."""
    settings = _base(kafka) | dict(GROUP_SETTINGS)
    settings |= {
        "group.id": group_id or kafka.group_id,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed" if read_committed else "read_uncommitted",
        # eager rebalancing: every rebalance revokes everything, then assigns afresh, which
        # keeps the worker's revoke handling to one simple path (drop + commit) and its
        # transactional.id unique in a generation; the configuration check refuses a
        # kafka.client assignor that is not eager (worker/config.py EAGER_ASSIGNORS)
        "partition.assignment.strategy": "roundrobin",
        "fetch.wait.max.ms": FETCH_WAIT_MS,
    }
    settings |= dict(extra or {})
    return Consumer(_with_raw(settings, kafka))


def producer(
    kafka: KafkaConfig,
    *,
    transactional_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Producer:
    """An idempotent producer; transactional when ``transactional_id`` is given."""
    settings = _base(kafka) | {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "none",  # values are zstd frames already
    }
    if transactional_id:
        settings |= {"transactional.id": transactional_id, **TRANSACTIONAL_SETTINGS}
    settings |= dict(extra or {})
    return Producer(_with_raw(settings, kafka))


@dataclass(frozen=True)
class Producers:
    """The producers of one process (a :class:`~worker.kafka.produce.ProducerFactory`):
    each takes records up to :func:`~worker.config.producer_max_bytes`."""

    kafka: KafkaConfig
    max_message_bytes: int
    #: topics' ``max.message.bytes`` as the broker described them (:func:`topic_max_bytes`)
    topic_max: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, kafka: KafkaConfig, limits: LimitsConfig) -> Producers:
        return cls(kafka, producer_max_bytes(kafka, limits))

    def limit(self, topic: str) -> RecordLimit:
        return record_limit(self.max_message_bytes, topic, self.topic_max)

    def __call__(self, transactional_id: str | None = None) -> Producer:
        extra: dict[str, Any] = {"message.max.bytes": self.max_message_bytes}
        if transactional_id is None:  # the worker's at-least-once producer
            extra["linger.ms"] = AT_LEAST_ONCE_LINGER_MS
        return producer(self.kafka, transactional_id=transactional_id, extra=extra)


def admin(kafka: KafkaConfig) -> AdminClient:
    return AdminClient(_with_raw(_base(kafka), kafka))


#: a topic found or created this long ago is taken to exist without asking the broker:
#: ``batchpipe serve`` publishes every batch through :func:`ensure_topics` (the requests,
#: results and pending topics), and each call made an admin client and listed every topic,
#: 2-55 ms a call on the embedded broker, twice a batch — a tenth of a 10-request batch's
#: time through the API. A publish that fails forgets what is known of its broker
#: (:func:`forget_topics`), as does an embedded broker that stops (it keeps nothing), so a
#: topic deleted under a running process is created again by the next publish.
KNOWN_S = 60.0
_KNOWN: dict[tuple[str, str], float] = {}  # (bootstrap, topic) -> when it was known to exist
_KNOWN_KEPT = 4_096


def forget_topics(bootstrap_servers: str) -> None:
    """Forget which topics are known to exist behind ``bootstrap_servers``."""
    for known in [k for k in _KNOWN if k[0] == bootstrap_servers]:
        del _KNOWN[known]


def ensure_topics(
    kafka: KafkaConfig,
    topics: Iterable[str],
    partitions: int | None = None,
    timeout_s: float = 30,
    *,
    compacted: bool = False,
    max_message_bytes: int | None = None,
    retain_forever: bool = False,
) -> list[str]:
    """Create the topics that are missing; returns the names created.

    ``compacted`` topics keep the last record per key (``cleanup.policy=compact``). With
    ``max_message_bytes`` (the producers' ``message.max.bytes``) they are created with
    a ``max.message.bytes`` that takes such a record, whatever the broker's default
    (1048588 on Apache Kafka). ``retain_forever`` topics are created with
    ``retention.ms=-1`` (records wait there until read). Existing topics are left as they
    are (docs/deploy.md). Topics known to exist for the last :data:`KNOWN_S` are not
    asked about again.
    """
    now, where = time.monotonic(), kafka.bootstrap_servers
    named = list(dict.fromkeys(topics))
    if all(now - _KNOWN.get((where, t), -math.inf) < KNOWN_S for t in named):
        return []
    client = admin(kafka)
    existing = set(client.list_topics(timeout=timeout_s).topics)
    wanted = [t for t in named if t not in existing]
    for topic in named:
        if topic in existing:
            remember(_KNOWN, (where, topic), now, _KNOWN_KEPT)
    if not wanted:
        return []
    count = partitions or kafka.partitions
    config = {"cleanup.policy": "compact"} if compacted else {}
    if max_message_bytes is not None:
        config["max.message.bytes"] = str(max_message_bytes + BATCH_FRAMING_BYTES)
    if retain_forever:
        config["retention.ms"] = "-1"
    futures = client.create_topics(
        [NewTopic(t, count, kafka.replication_factor, config=config) for t in wanted],
        request_timeout=timeout_s,
    )
    created = []
    for topic, future in futures.items():
        try:
            future.result()
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
        remember(_KNOWN, (where, topic), now, _KNOWN_KEPT)
    return created


def partition_count(kafka: KafkaConfig, topic: str, timeout_s: float = 30) -> int:
    """How many partitions ``topic`` has (0 where it does not exist)."""
    found = admin(kafka).list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None or found.error is not None:
        return 0
    return len(found.partitions)


def topic_max_bytes(
    kafka: KafkaConfig, topics: Iterable[str], timeout_s: float = 30
) -> dict[str, int]:
    """Each of ``topics``' ``max.message.bytes``, where the broker describes one: the most
    a record batch may have there, which librdkafka does not check before sending."""
    resources = [ConfigResource("topic", t) for t in dict.fromkeys(topics)]
    client = admin(kafka)  # held until every future is answered: they fail once it is gone
    found: dict[str, int] = {}
    for resource, future in client.describe_configs(resources, request_timeout=timeout_s).items():
        entry = future.result().get("max.message.bytes")
        if entry is not None and entry.value is not None:
            found[resource.name] = int(entry.value)
    return found
