"""librdkafka's producer in memory, on a :class:`~tests.unit.worker.fakes.FakeBroker`.

:class:`FakeProducer` models what the publishers rely on:

* not transactional: a record reaches the broker at ``produce``; its delivery report is
  served by ``poll``/``flush`` (a scripted ``"delivery"`` fault fails it instead);
* transactional: records produced in a transaction, and the offsets sent to it, reach the
  broker (``broker.sent``, what read_committed readers see; ``broker.committed``) at
  ``commit_transaction``; ``abort_transaction`` discards them. Every record produced
  is in ``broker.raw`` too, and every committed transaction in ``broker.transactions``;
  a failed delivery inside a transaction leaves it refusing everything but
  ``abort_transaction``, as librdkafka's abortable state does;
* a record produced to an explicit ``partition`` gets the next offset of that partition's
  log (``broker.stored``, committed, aborted or not: a broker gives offsets at produce),
  which its delivery report carries;
* ``broker.deliveries_held``: ``poll`` serves no delivery report (the broker has not
  answered yet); ``flush`` waits for them all;
* a record over ``message.max.bytes`` is refused at ``produce`` (``MSG_SIZE_TOO_LARGE``);
* faults scripted on the broker (:meth:`FakeBroker.fail`) are raised by the next call of
  that method: an abortable one leaves the transaction refusing everything but
  ``abort_transaction`` (``produce`` says ``_STATE``), a fatal one ends the producer;
* a newer producer of the same ``transactional.id`` (``init_transactions``, or
  :meth:`FakeBroker.fence`) fences this one: every later call fails fatally;
* a call of a method gated on the broker (:meth:`FakeBroker.gate`) waits for its gate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from worker.kafka.produce import OnDelivery, RecordLimit, record_limit, record_size

if TYPE_CHECKING:
    from .fakes import FakeBroker


class FakeProducer:
    def __init__(self, broker: FakeBroker, transactional_id: str | None, limit: int) -> None:
        self._broker = broker
        self._id = transactional_id
        self._limit = limit
        self._epoch = 0
        self._in_transaction = False
        self._must_abort: KafkaError | None = None
        self._fatal: KafkaError | None = None
        self._pending: list[tuple[str, bytes | str | None, bytes | None, Any]] = []
        self._offsets: list[TopicPartition] = []
        self._reports: list[Callable[[], None]] = []

    # -- transactions ------------------------------------------------------------------

    def init_transactions(self, timeout: float = -1) -> None:
        self._check("init_transactions")
        assert self._id is not None, "not a transactional producer"
        self._epoch = self._broker.fence(self._id)

    def begin_transaction(self) -> None:
        self._check("begin_transaction")
        if self._in_transaction:
            _raise(KafkaError._STATE, "a transaction is in progress")
        self._in_transaction = True

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._check("send_offsets_to_transaction", in_transaction=True)
        self._offsets.extend(positions)

    def commit_transaction(self, timeout: float = -1) -> None:
        self._check("commit_transaction", in_transaction=True)
        for topic, key, value, headers in self._pending:
            self._broker.publish(topic, key, value, headers)
        self._broker.committed.update({(tp.topic, tp.partition): tp.offset for tp in self._offsets})
        offsets = tuple((tp.topic, tp.partition, tp.offset) for tp in self._offsets)
        self._broker.transactions.append((self._id or "", len(self._pending), offsets))
        self._end()

    def abort_transaction(self, timeout: float = -1) -> None:
        self._check("abort_transaction", aborting=True)
        self._end()

    # -- records -----------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | str | None = None,
        *,
        on_delivery: OnDelivery | None = None,
        headers: list[tuple[str, bytes | str | None]] | None = None,
        partition: int = -1,
    ) -> None:
        self._check("produce", in_transaction=self._id is not None)
        if record_size(key, value, headers or []) > self._limit:
            _raise(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
        record = (topic, key, value, tuple(headers or ()))
        self._broker.raw.append(record)
        failure = self._broker.next_fault("delivery")
        offset = -1
        if partition >= 0 and failure is None:
            stored = self._broker.stored.setdefault((topic, partition), [])
            offset = len(stored)
            stored.append(value)
        if self._id is not None:
            self._pending.append(record)
        elif failure is None:
            self._broker.publish(*record)
        delivered = _Delivered(partition, offset)

        def report() -> None:
            if failure is not None and self._in_transaction:
                self._must_abort = failure
            if on_delivery is not None:
                on_delivery(failure, cast(Message, delivered))

        self._reports.append(report)

    def poll(self, timeout: float = -1) -> int:
        if self._broker.deliveries_held:
            return 0
        return self._report()

    def flush(self, timeout: float = -1) -> int:
        self._broker.pass_gate("flush")
        self._report()  # waits for every delivery, held or not
        return 0

    def _report(self) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report()
        return len(reports)

    # -- state -------------------------------------------------------------------------

    def _check(self, method: str, *, in_transaction: bool = False, aborting: bool = False) -> None:
        self._broker.pass_gate(method)
        fenced = self._id is not None and self._broker.epoch(self._id) != self._epoch
        if self._fatal is None and self._epoch and fenced:
            self._fatal = KafkaError(KafkaError._FENCED, "producer fenced", fatal=True)
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        fault = self._broker.next_fault(method)
        if fault is not None:
            if fault.fatal():
                self._fatal = fault
            elif fault.txn_requires_abort():
                self._must_abort = fault
            raise KafkaException(fault)
        if self._must_abort is not None and not aborting:
            _raise(KafkaError._STATE, f"the transaction must be aborted: {self._must_abort}")
        if in_transaction and not self._in_transaction:
            _raise(KafkaError._STATE, "no transaction in progress")

    def _end(self) -> None:
        self._in_transaction = False
        self._must_abort = None
        self._pending.clear()
        self._offsets.clear()


@dataclass(frozen=True)
class _Delivered:
    """What a delivery report's message says of where the record went."""

    at: int
    at_offset: int

    def partition(self) -> int:
        return self.at

    def offset(self) -> int:
        return self.at_offset


@dataclass(frozen=True)
class FakeProducers:
    """The :class:`~worker.kafka.produce.ProducerFactory` of :class:`FakeProducer`\\ s."""

    broker: FakeBroker

    @property
    def max_message_bytes(self) -> int:
        return self.broker.max_message_bytes

    def limit(self, topic: str) -> RecordLimit:
        return record_limit(self.max_message_bytes, topic, self.broker.topic_max)

    def __call__(self, transactional_id: str | None = None) -> FakeProducer:
        return FakeProducer(self.broker, transactional_id, self.max_message_bytes)


def _raise(code: int, reason: str) -> None:
    raise KafkaException(KafkaError(code, reason))
