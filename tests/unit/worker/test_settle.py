"""Closing transactions: a producer whose last transaction ended while another of the
worker's was open, and that then falls idle, ends one offsets-only transaction that
re-commits the offset it already committed (worker/kafka/transactions.py, issue 24).
Busy producers and the last of a round never need one. The broker-side reason is tested
on the embedded broker in tests/integration/test_txn_visibility.py."""

from __future__ import annotations

from functools import partial
from uuid import uuid4

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.kafka.transactions import TransactionalPublisher

from .fake_producer import FakeProducers
from .fakes import FakeBroker, FakeConsumer

TOPIC = "requests"
Ended = tuple[str, int, tuple[tuple[str, int, int], ...]]


class _Worker:
    """A TransactionalPublisher over three partitions, answering one record at a time."""

    def __init__(self) -> None:
        self.broker = FakeBroker(TOPIC, 3)
        self.tracker = OffsetTracker()
        self.prefix = f"txn-{uuid4()}"
        self.publisher = TransactionalPublisher(
            KafkaConfig(),
            FakeConsumer(self.broker),
            self.tracker,
            FakeProducers(self.broker),
            self.prefix,
        )
        self.partitions: list[Partition] = [(TOPIC, p) for p in range(3)]
        self.publisher.assign(self.partitions)
        self.next = [0, 0, 0]

    def answer(self, *partitions: int) -> None:
        for number in partitions:
            origin, offset = self.partitions[number], self.next[number]
            self.next[number] += 1
            self.tracker.add(origin, offset)
            self.publisher.send(
                "results", "k", b"v", [], origin, partial(self.tracker.done, origin, offset)
            )

    def round(self, *partitions: int) -> list[Ended]:
        """Answer a record of each of ``partitions``, commit; the transactions ended."""
        before = len(self.broker.transactions)
        self.answer(*partitions)
        self.publisher.commit()
        return self.broker.transactions[before:]

    def txn(self, number: int, records: int, offset: int) -> Ended:
        return (f"{self.prefix}.{TOPIC}.{number}", records, ((TOPIC, number, offset),))


def test_producers_falling_idle_unsettled_end_one_offsets_only_transaction() -> None:
    w = _Worker()
    # 0 and 1 end while 2 is still open: unsettled; 2 ended last
    assert w.round(0, 1, 2) == [w.txn(0, 1, 1), w.txn(1, 1, 1), w.txn(2, 1, 1)]
    # 0 and 1 fell idle: each re-commits offset 1 once every open transaction has ended
    assert w.round(2) == [w.txn(2, 1, 2), w.txn(0, 0, 1), w.txn(1, 0, 1)]
    assert w.round() == []  # settled; 2 ended alone, so it is settled too
    assert w.broker.committed == {(TOPIC, 0): 1, (TOPIC, 1): 1, (TOPIC, 2): 2}


def test_busy_producers_are_settled_by_their_next_transaction() -> None:
    w = _Worker()
    w.round(0, 1)
    assert w.round(0, 1) == [w.txn(0, 1, 2), w.txn(1, 1, 2)]
    assert w.round(1) == [w.txn(1, 1, 3), w.txn(0, 0, 2)]


def test_revoked_partitions_are_settled_at_once_and_every_open_transaction_ends() -> None:
    w = _Worker()
    w.answer(0, 1)
    w.publisher.revoke([w.partitions[0]])
    # 0 ended while 1 was open: settled before it is handed over; 1 ends with it
    assert w.broker.transactions == [w.txn(0, 1, 1), w.txn(1, 1, 1), w.txn(0, 0, 1)]
