"""Records over the producers' message.max.bytes, with librdkafka and a real broker.

librdkafka refuses such a record at ``produce`` time (``MSG_SIZE_TOO_LARGE``): the
publishers turn that into :class:`MessageTooLarge`, the open transaction is unharmed,
and the worker answers with something smaller instead of exiting.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from uuid import uuid4

import pytest
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from batcher import OffsetTracker
from tests.integration.harness import publish, read_results, read_topic, running_worker
from worker.config import Config, LimitsConfig
from worker.errors import ErrorCode
from worker.kafka import clients
from worker.kafka.publisher import AtLeastOncePublisher, MessageTooLarge, Publisher
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import TransactionalPublisher
from worker.wire.messages import InferenceRequest

pytestmark = pytest.mark.integration

LIMIT = 1_000_000


def _publisher(config: Config, delivery: str) -> Publisher:
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic])
    consumer = clients.consumer(k)
    producers = clients.Producers(k, LIMIT)
    if delivery == "exactly_once":
        txn = TransactionalPublisher(
            k, consumer, OffsetTracker(), producers, f"txn-{uuid4()}", BrokerStableCheck(k)
        )
        txn.assign([(k.requests_topic, 0)])
        return txn
    return AtLeastOncePublisher(k, consumer, OffsetTracker(), producers)


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_a_record_over_the_limit_is_refused_and_the_publisher_goes_on(
    kafka_config: Config, delivery: str
) -> None:
    publisher = _publisher(kafka_config, delivery)
    results, origin = kafka_config.kafka.results_topic, (kafka_config.kafka.requests_topic, 0)
    answered: list[str] = []
    with pytest.raises(MessageTooLarge) as refused:
        publisher.send(
            results, "big", b"x" * (LIMIT + 1), [], origin, lambda: answered.append("big")
        )
    assert (refused.value.size, refused.value.limit) == (LIMIT + 4, LIMIT)
    publisher.send(results, "small", b"fits", [], origin, lambda: answered.append("small"))
    publisher.commit()
    publisher.close()
    assert answered == ["small"]
    [record] = read_topic(kafka_config, results, 1)
    assert record.value() == b"fits"


def test_a_dead_letter_too_large_for_the_producer_does_not_stop_the_worker(
    kafka_config: Config,
) -> None:
    # the worker's producers take 1,000,000 bytes; the record is bigger than that
    config = replace(kafka_config, limits=LimitsConfig(max_message_bytes=900_000))
    config = replace(config, engine=replace(config.engine, kind="echo", model="echo"))
    big = b"{" + secrets.token_urlsafe(1_500_000).encode()
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    producer = clients.Producers(k, 4_000_000)()
    producer.produce(k.requests_topic, value=big, key=b"k", partition=0)
    assert producer.flush(30) == 0
    publish(config, [InferenceRequest(custom_id="after", prompt="still served")])

    with running_worker(config):
        [result] = read_results(config, 1)
        [letter] = read_topic(config, k.dead_letter_topic, 1)
    assert result.custom_id == "after" and result.status == "completed"
    headers = dict(letter.headers() or [])
    assert headers["error-code"] == b"4003" and not letter.value()
    message = headers["error-message"]
    assert isinstance(message, bytes)
    assert str(len(big)).encode() in message and b"message.max.bytes (1000000)" in message


def test_topics_the_worker_creates_take_what_its_producers_send(kafka_config: Config) -> None:
    k = kafka_config.kafka
    producers = clients.Producers.of(k, kafka_config.limits)
    clients.ensure_topics(k, [k.results_topic], max_message_bytes=producers.max_message_bytes)
    resource = ConfigResource("topic", k.results_topic)
    admin = clients.admin(k)  # held: the future fails once its client is gone
    [future] = admin.describe_configs([resource]).values()
    allowed = int(future.result()["max.message.bytes"].value)
    assert allowed >= producers.max_message_bytes == 6 * 1024 * 1024 + 64 * 1024


def test_a_results_topic_allowing_less_than_the_producers_is_read_at_start(
    kafka_config: Config,
) -> None:
    # created beforehand with a small max.message.bytes (the embedded broker stores it but
    # does not enforce it): the worker reads it and answers a result over it with 4003
    config = replace(kafka_config, engine=replace(kafka_config.engine, kind="echo", model="echo"))
    k = config.kafka
    admin = clients.admin(k)
    topic = NewTopic(k.results_topic, k.partitions, config={"max.message.bytes": "20000"})
    for future in admin.create_topics([topic]).values():
        future.result()
    blob = secrets.token_urlsafe(30_000)
    publish(
        config,
        [
            InferenceRequest(custom_id="big", prompt="hi", metadata={"blob": blob}),
            InferenceRequest(custom_id="small", prompt="fits"),
        ],
    )
    with running_worker(config):
        results = {r.custom_id: r for r in read_results(config, 2)}
    error = results["big"].error
    assert results["big"].status == "failed" and error is not None
    assert error.code == ErrorCode.OVER_LIMIT
    assert f"{k.results_topic}'s max.message.bytes (20000)" in error.message
    assert results["small"].status == "completed"
