"""Publishing without fair share: the requests topic, no transaction, a seal (§7).

With ``scheduling.fair: false`` a batch goes straight to the requests topic. It was one
transaction there; a publisher killed mid-publish then held the last stable offset of
every partition it wrote (for good on the embedded broker, ``transaction.timeout.ms`` on
Kafka), and one-shot transactions racing on a partition of the embedded broker could be
left uncompleted: either way every later batch of those partitions was hidden (issue 49).
Now an idempotent producer writes the requests, each with the seal header, and the
control topic carries the batch's signs (:mod:`worker.kafka.seals`): ``open`` first and at
least every ``ALIVE_S`` while publishing (the delivery wait at the end too), ``sealed``
with the count once every request is acknowledged, ``void`` on a failure. The workers
hold the requests until ``sealed``, so a batch still runs whole or not at all.

A publisher that went ``SEAL_HOLD_S`` without a sign (stopped, or its process starved)
voids its batch rather than seal it: workers that read no sign for longer may have given
it up already, and none may run it in part.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, KafkaException

from batchpipe.deliveries import Deliveries
from batchpipe.paced import paced
from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.produce import Headers, KafkaProducer, produce
from worker.kafka.seals import ALIVE_S, SEAL_HEADER, SEAL_HOLD_S, SEAL_VALUE, Seal, State
from worker.wire.messages import InferenceRequest

#: lines read on a thread: ``None`` when none came this long, to sign while the store is slow
CHUNK_S = 0.5
#: the longest the last deliveries are waited for
DELIVERY_WAIT_S = 35.0

Encode = Callable[[InferenceRequest], tuple[str, bytes, Headers]]


class PublishVoided(KafkaException):
    """The publisher went too long without a sign: its batch is void, none of it runs."""


class _Signs:
    """The batch's signs on the control topic, and the publisher's own clock of them."""

    def __init__(self, producer: KafkaProducer, topic: str, batch_id: str) -> None:
        self._producer, self._topic, self._batch_id = producer, topic, batch_id
        self._last = time.monotonic()

    def write(self, state: State, count: int = 0) -> None:
        seal = Seal(self._batch_id, state, time.time(), count)
        produce(self._producer, self._topic, seal.key, seal.encode(), [])
        self._last = time.monotonic()

    def alive(self) -> None:
        """An ``open`` sign when one is due; :class:`PublishVoided` when the last one is
        too old for the workers to still be waiting for this batch."""
        since = time.monotonic() - self._last
        if since >= SEAL_HOLD_S:
            raise PublishVoided(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"no sign of batch {self._batch_id} for {since:.0f} s (at most "
                    f"{SEAL_HOLD_S:.0f} s): the workers may have given it up, so it is void",
                )
            )
        if since >= ALIVE_S:
            self.write("open")


def publish_direct(
    kafka: KafkaConfig,
    batch_id: str,
    requests: Iterable[InferenceRequest],
    encode: Encode,
    extra: dict[str, object],
) -> int:
    """Publish ``requests`` (``encode`` gives each one's topic, value and headers) and seal
    them as batch ``batch_id``; returns how many. Raises ``KafkaException`` when the batch
    is not sealed (it is then void: no worker runs any of it)."""
    deliveries = Deliveries()
    clients.ensure_topics(kafka, [kafka.control_topic], partitions=1, compacted=True)
    producer = clients.producer(
        kafka,
        extra={
            **extra,
            "message.timeout.ms": int(SEAL_HOLD_S * 1000),
            "on_delivery": deliveries.report,
            "delivery.report.only.error": True,
        },
    )
    signs = _Signs(producer, kafka.control_topic, batch_id)
    count = 0
    try:
        signs.write("open")
        for req in paced(requests, CHUNK_S):
            deliveries.check()
            signs.alive()
            if req is None:
                continue
            topic, value, headers = encode(req)
            produce(producer, topic, req.custom_id.encode(), value, [*headers, _SEALED])
            count += 1
        _deliver(producer, deliveries, signs)
        signs.write("sealed", count)
        _deliver(producer, deliveries, signs)
    except BaseException:
        clients.forget_topics(kafka.bootstrap_servers)  # a topic may be gone: ask again
        # best effort: the workers give the batch up without it too, after GIVE_UP_S
        with contextlib.suppress(Exception):  # the first failure is the one to raise
            signs.write("void")
            producer.flush(5.0)
        raise
    return count


_SEALED = (SEAL_HEADER, SEAL_VALUE)


def _deliver(producer: KafkaProducer, deliveries: Deliveries, signs: _Signs) -> None:
    """Wait for every delivery, signing meanwhile; ``KafkaException`` if one failed or some
    never came within :data:`DELIVERY_WAIT_S`."""
    deadline = time.monotonic() + DELIVERY_WAIT_S
    while (left := producer.flush(min(1.0, ALIVE_S / 2))) and time.monotonic() < deadline:
        if deliveries.failed is not None:
            break
        signs.alive()
    deliveries.check(left)
