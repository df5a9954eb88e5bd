"""What a publisher's producer could not deliver (docs/architecture.md §7, §10).

Both publishers (fair share's pending topic and, without it, the requests topic) ask
librdkafka for a report of failed deliveries only (a report for each record cost 7 % of
``submit``'s lines a second, ``bench/publish.py``): the first failure fails the publish,
as do records still unacknowledged when the publisher stops waiting for them.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


class Deliveries:
    """The first failed delivery of one publish; :meth:`report` is the ``on_delivery``."""

    def __init__(self) -> None:
        self.failed: KafkaError | None = None

    def report(self, error: KafkaError | None, _msg: object) -> None:
        if error is not None and self.failed is None:
            self.failed = error

    def check(self, left: int = 0) -> None:
        """``KafkaException`` if a delivery failed, or ``left`` records never came."""
        if self.failed is not None:
            raise KafkaException(self.failed)
        if left:
            raise KafkaException(
                KafkaError(KafkaError._MSG_TIMED_OUT, f"{left} records not acknowledged")
            )
