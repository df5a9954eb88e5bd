"""One pending record into the requests topic, or, when that cannot be, its dead letter.

The feeder copies a record's key, value and headers as they are, setting one: a shared
record's virtual tag (``batchpipe-tag``, newcomers first, §10). It never decodes a
request, and a value the worker cannot read is answered by the worker (4001/4003 or a
dead letter, §5). What the feeder's producer refuses outright — a record over its
``message.max.bytes`` (a direct publisher may have written one: the pending topic takes
what its publisher's limit allowed), a key or header the client cannot encode — would
otherwise fail the whole step again and again. Any other Kafka error (the transaction's
state, the client's) is not the record's: it fails the step, which is done again. A
record refused outright is answered here, inside the step's transaction: a dead letter
on the dead-letter topic as the worker writes one for a record too large to carry (§5:
the original key and headers, no value, ``error-code``, ``error-message``, ``source``),
so every request still gets exactly one answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from worker.errors import ErrorCode
from worker.feeder.headers import headers_of, with_tag

log = logging.getLogger(__name__)

#: the longest error message a dead letter carries, as the worker's
MAX_MESSAGE = 1000
#: the longest key a last-resort dead letter keeps (a custom_id is far shorter)
MAX_KEY = 4096


class Producing(Protocol):
    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None: ...


def forward(
    producer: Producing,
    requests_topic: str,
    dead_letter_topic: str,
    m: Message,
    on_delivery: Callable[[KafkaError | None, Message], None],
    partition: int | None = None,
    tag: float | None = None,
) -> bool:
    """Produce ``m`` to ``requests_topic`` (to ``partition``, or where the producer's
    partitioner puts it; with its virtual ``tag`` in a header when given); True if it went
    there, False if its dead letter went to ``dead_letter_topic`` instead."""
    headers = headers_of(m)
    if tag is not None:
        headers = with_tag(headers, tag)
    where = {} if partition is None else {"partition": partition}
    try:
        producer.produce(
            requests_topic,
            value=m.value(),
            key=m.key(),
            headers=headers,
            on_delivery=on_delivery,
            **where,
        )
        return True
    except BufferError:
        raise  # librdkafka's queue is full: the step fails and is done again
    except KafkaException as exc:
        if not _too_large(exc):
            raise  # the transaction's or the client's state, not this record: a new step
        code, cause = ErrorCode.OVER_LIMIT, exc.args[0]
    except (TypeError, ValueError) as exc:  # a key or header the client cannot send
        code, cause = ErrorCode.MALFORMED, exc
    message = f"the feeder could not move this record to {requests_topic}: {cause}"
    log.error("feeder: pending offset %s dead-lettered: %s", m.offset(), message)
    letter = [
        ("error-code", str(int(code)).encode()),
        ("error-message", message[:MAX_MESSAGE].encode("utf-8", "replace")),
        ("source", f"{m.topic()}/{m.partition()}/{m.offset()}".encode()),
    ]
    key = m.key()
    original = list(headers.items()) if isinstance(headers, dict) else list(headers or ())
    try:
        producer.produce(dead_letter_topic, value=None, key=key, headers=[*original, *letter])
    except (KafkaException, TypeError, ValueError):
        # the original headers or key are what cannot be written: the letter alone, keyed
        # as far as a key fits
        small = key if key is not None and len(key) <= MAX_KEY else None
        producer.produce(dead_letter_topic, value=None, key=small, headers=letter)
    return False


def _too_large(exc: Exception) -> bool:
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    return isinstance(error, KafkaError) and error.code() == KafkaError.MSG_SIZE_TOO_LARGE
