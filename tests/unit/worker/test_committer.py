"""One transaction per commit, one producer per worker, committed on the committer thread
(worker/kafka/transactions.py, committer.py, issue 32): the publisher on fake producers.

What it promises: a commit holds every answer handed over since the last one and the
offsets they advance; answers given while a commit runs go into the next one; a revoke
waits for the commit in flight; the worker's id is its lowest partition's, and an
assignment fences every earlier user of its partitions' ids and aborts what they left
open; a worker that falls idle after answers ends offsets-only transactions until the broker
finds nothing held on the topics it wrote, and settles for a bounded time before giving its
producer up; a
transaction aborted for good drops its partitions' answers and offsets until rewound.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from uuid import uuid4

import pytest
from confluent_kafka import KafkaError

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.kafka import transactions
from worker.kafka.committer import REPLAYS
from worker.kafka.publisher import GenerationLost, TransactionAborted
from worker.kafka.transactions import TransactionalPublisher

from .fake_producer import FakeProducer, FakeProducers
from .fake_stable import FakeStableCheck
from .fakes import FakeBroker, FakeConsumer
from .rig import WAIT_S

TOPIC = "requests"
STATE = KafkaError(KafkaError._STATE, "Producing not allowed in transactional state")
FENCED = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)


class _Worker:
    """A TransactionalPublisher over three partitions, answering one record at a time."""

    def __init__(self) -> None:
        self.broker = FakeBroker(TOPIC, 3)
        self.tracker = OffsetTracker()
        self.prefix = f"txn-{uuid4()}"
        self.stable = FakeStableCheck()
        self.publisher = TransactionalPublisher(
            KafkaConfig(commit_interval_ms=0),
            FakeConsumer(self.broker),
            self.tracker,
            FakeProducers(self.broker),
            self.prefix,
            self.stable,
        )
        self.partitions: list[Partition] = [(TOPIC, p) for p in range(3)]
        self.next = [0, 0, 0]

    def txn_id(self, number: int) -> str:
        return f"{self.prefix}.{TOPIC}.{number}"

    def answer(self, *partitions: int) -> None:
        for number in partitions:
            origin, offset = self.partitions[number], self.next[number]
            self.next[number] += 1
            self.tracker.add(origin, offset)
            self.publisher.send(
                "results", "k", b"v", [], origin, partial(self.tracker.done, origin, offset), offset
            )

    def offsets(self, **at: int) -> tuple[tuple[str, int, int], ...]:
        return tuple((TOPIC, int(p[1:]), o) for p, o in at.items())


def test_one_transaction_holds_every_partitions_answers_and_offsets() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    w.answer(0, 1, 2, 2)
    w.publisher.commit()
    assert w.broker.transactions == [(w.txn_id(0), 4, w.offsets(p0=1, p1=1, p2=2))]
    assert w.broker.committed == {(TOPIC, 0): 1, (TOPIC, 1): 1, (TOPIC, 2): 2}


def test_answers_given_while_a_commit_runs_go_into_the_next_transaction() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    gate = w.broker.gate("commit_transaction")
    w.answer(0, 1)
    w.publisher.maybe_commit(time.monotonic())  # handed over; the committer waits at the gate
    w.answer(2)
    w.publisher.maybe_commit(time.monotonic())  # not now: a commit is in flight
    assert w.broker.transactions == []
    gate.set()
    w.publisher.commit()
    assert w.broker.transactions == [
        (w.txn_id(0), 2, w.offsets(p0=1, p1=1)),
        (w.txn_id(0), 1, w.offsets(p2=1)),
    ]


def test_a_revoke_waits_for_the_commit_in_flight_and_commits_the_rest() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    gate = w.broker.gate("commit_transaction")
    w.answer(0)
    w.publisher.maybe_commit(time.monotonic())
    w.answer(1)
    revoking = threading.Thread(target=w.publisher.revoke, args=(w.partitions,))
    revoking.start()
    # it cannot end while the commit in flight waits at the gate
    assert w.broker.transactions == []
    gate.set()
    revoking.join(WAIT_S)
    assert not revoking.is_alive()
    assert w.broker.transactions == [
        (w.txn_id(0), 1, w.offsets(p0=1)),
        (w.txn_id(0), 1, w.offsets(p1=1)),
        # its last partitions: it settles before giving its producer up, once when the
        # broker finds nothing held
        (w.txn_id(0), 0, w.offsets(p0=1, p1=1)),
    ]


def test_a_worker_falling_idle_after_answers_settles_with_offsets_only_transactions() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    w.answer(0, 1)
    w.publisher.commit()
    w.publisher.commit()  # nothing answered since: re-commits what it committed
    w.publisher.commit()  # the next settle waits its back-off (0.1 s, doubling)
    assert w.broker.transactions == [
        (w.txn_id(0), 2, w.offsets(p0=1, p1=1)),
        (w.txn_id(0), 0, w.offsets(p0=1, p1=1)),
    ]


def test_settling_goes_on_while_a_written_partition_is_held_and_ends_once_none_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the gaps and the window shrunk a hundredfold: held past the window (where settling
    # used to stop for good), it goes on at the slow gap, and stops once nothing is held
    monkeypatch.setattr(transactions, "SETTLE_FIRST_S", 0.001)
    monkeypatch.setattr(transactions, "SETTLE_MAX_GAP_S", 0.02)
    monkeypatch.setattr(transactions, "SETTLE_SLOW_GAP_S", 0.05)
    monkeypatch.setattr(transactions, "SETTLE_WINDOW_S", 0.3)
    w = _Worker()
    w.stable.held = {("results", 2)}
    w.publisher.assign(w.partitions)
    w.answer(0, 1)
    w.publisher.commit()

    def settles() -> int:
        return len(w.broker.transactions) - 1

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and w.stable.asked < 12:
        w.publisher.maybe_commit(time.monotonic(), idle=True)
        time.sleep(0.005)
    assert w.stable.asked >= 12  # past the 0.3 s window: more than its gaps allow within it
    assert all(t[1] == 0 and t[2] == w.offsets(p0=1, p1=1) for t in w.broker.transactions[1:])
    w.stable.held = set()
    before = settles()
    while time.monotonic() < deadline and w.publisher._settle is not None:
        w.publisher.maybe_commit(time.monotonic(), idle=True)
        time.sleep(0.005)
    assert w.publisher._settle is None, "still settling with nothing held"
    after = settles()
    assert after - before <= 2  # the one asked beside the answer "nothing held", at most
    time.sleep(0.1)
    w.publisher.maybe_commit(time.monotonic(), idle=True)
    assert settles() == after  # settled: no more


def test_a_worker_giving_its_producer_up_settles_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transactions, "SETTLE_FIRST_S", 0.01)
    monkeypatch.setattr(transactions, "SETTLE_CLOSE_S", 0.3)
    w = _Worker()
    w.stable.held = {("results", 0)}
    w.publisher.assign(w.partitions)
    w.answer(0)
    w.publisher.commit()
    started = time.monotonic()
    w.publisher.close()
    # held throughout: several offsets-only transactions, then given up at the bound
    assert time.monotonic() - started < WAIT_S
    settles = w.broker.transactions[1:]
    assert len(settles) >= 2
    assert all(t[1] == 0 for t in settles)


def test_the_worker_is_its_lowest_partition_and_reclaims_the_others_ids() -> None:
    w = _Worker()
    # a dead worker left a transaction open under partition 2's id
    dead = FakeProducer(w.broker, w.txn_id(2), w.broker.max_message_bytes)
    dead.init_transactions()
    dead.begin_transaction()
    dead.produce("results", b"lost", "k")
    w.publisher.assign(w.partitions[1:])
    assert w.broker.epoch(w.txn_id(1)) == 1  # the worker's own producer
    assert w.broker.epoch(w.txn_id(2)) == 2  # init_transactions again: the dead one fenced
    with pytest.raises(Exception, match="fenced"):
        dead.commit_transaction()
    w.answer(2)
    w.publisher.commit()
    assert w.broker.transactions == [(w.txn_id(1), 1, w.offsets(p2=1))]
    assert [s.value for s in w.broker.on("results")] == [b"v"]  # never the dead one's


def test_an_assignment_of_a_lower_partition_commits_under_the_old_id_first() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions[1:])
    w.answer(1)
    w.publisher.assign(w.partitions[:1])
    # and settles under it (once: nothing held) before the id changes
    assert w.broker.transactions == [
        (w.txn_id(1), 1, w.offsets(p1=1)),
        (w.txn_id(1), 0, w.offsets(p1=1)),
    ]
    w.answer(0)
    w.publisher.commit()
    assert w.broker.transactions[-1] == (w.txn_id(0), 1, w.offsets(p0=1))


def _answered_then_failing(method: str, error: KafkaError, times: int = 1) -> _Worker:
    """A worker owning every partition that answered one record of partition 0; its next
    ``times`` calls of ``method`` fail with ``error``."""
    w = _Worker()
    w.publisher.assign(w.partitions)
    w.answer(0)
    w.broker.fail(method, error, times)
    return w


def test_a_transaction_aborted_for_good_drops_its_partitions_until_they_are_rewound() -> None:
    w = _answered_then_failing("produce", STATE, times=REPLAYS + 1)
    with pytest.raises(TransactionAborted) as aborted:
        w.publisher.commit()
    assert aborted.value.partitions == [w.partitions[0]]
    assert w.publisher.aborts == REPLAYS + 1
    # until the loop rewinds partition 0, answers to it are dropped and its offsets stay
    w.answer(0, 1)
    w.publisher.commit()
    assert w.broker.transactions == [(w.txn_id(0), 1, w.offsets(p1=1))]
    w.publisher.forget([w.partitions[0]])
    w.tracker.forget([w.partitions[0]])
    w.next[0] = 0
    w.answer(0)
    w.publisher.commit()
    assert w.broker.transactions[-1] == (w.txn_id(0), 1, w.offsets(p0=1))


def test_a_fenced_producer_is_a_lost_generation_that_drops_the_producer() -> None:
    w = _answered_then_failing("commit_transaction", FENCED)
    with pytest.raises(GenerationLost, match="fenced"):
        w.publisher.commit()
    assert w.broker.transactions == []
    # every partition and answer is gone; the next assignment builds a new producer
    with pytest.raises(RuntimeError, match="does not own"):
        w.answer(0)
    w.publisher.assign(w.partitions)
    w.tracker.forget(w.partitions)
    w.next = [0, 0, 0]
    w.answer(0)
    w.publisher.commit()
    assert w.broker.transactions == [(w.txn_id(0), 1, w.offsets(p0=1))]


def test_an_answer_goes_in_the_next_transaction_whatever_runs_ahead_of_it() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    w.tracker.add(w.partitions[0], 0)  # a long request, still running
    w.next[0] = 1
    w.answer(0, 0, 1)
    w.publisher.commit()
    # partition 0's two answers go now, its offset stays behind the long request (the
    # committed one sent again: every transaction carries offsets)
    assert w.broker.transactions == [(w.txn_id(0), 3, w.offsets(p1=1))]
    w.tracker.done(w.partitions[0], 0)  # answered (its own answer is not sent here)
    w.publisher.commit()
    assert w.broker.transactions[-1] == (w.txn_id(0), 0, w.offsets(p0=3))


def test_a_revoke_commits_the_answers_ahead_of_an_unanswered_record() -> None:
    w = _Worker()
    w.publisher.assign(w.partitions)
    w.tracker.add(w.partitions[0], 0)
    w.next[0] = 1
    w.answer(0, 0)
    w.publisher.revoke(w.partitions)
    assert [n for _, n, _ in w.broker.transactions] == [2, 0]  # then one settle: its last


def test_a_fenced_producer_of_lost_partitions_is_dropped_quietly() -> None:
    w = _answered_then_failing("commit_transaction", FENCED)
    w.publisher.maybe_commit(time.monotonic())
    w.publisher.lost(w.partitions)  # their new owner fenced it
    assert w.broker.transactions == []
