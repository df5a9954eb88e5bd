"""Kafka errors in publish and commit, classified: the worker loop with the real publishers
on fake producers (``tests/unit/worker/fake_producer.py``).

Abortable → the transaction is aborted and done again (nothing lost, no duplicate among
committed results); retriable → called again; fenced → a lost generation, the worker
rejoins; fatal → :class:`FatalKafkaError`; a partition lost with an already fenced
producer → dropped quietly.
"""

from __future__ import annotations

from collections import Counter

import pytest
from confluent_kafka import KafkaError

from worker.kafka.committer import REPLAYS
from worker.kafka.publisher import FatalKafkaError

from .fakes import GatedEngine
from .rig import P0, P1, Rig, loop_config, rig

ABORTABLE = KafkaError(KafkaError.INVALID_TXN_STATE, "abortable", txn_requires_abort=True)
STATE = KafkaError(KafkaError._STATE, "Producing not allowed in transactional state")
TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
FENCED = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)


def submit(r: Rig, n: int = 4) -> set[str]:
    for i in range(n):
        r.broker.submit(i % 2, f"r{i}", f"hello {i}")
    return {f"r{i}" for i in range(n)}


def run(r: Rig, ids: set[str]) -> None:
    r.consumer.rebalance("assign", [P0, P1])
    r.step_until(lambda: r.settled(ids), "every record answered and committed")
    assert r.answers() == Counter(dict.fromkeys(ids, 1))  # among committed results


@pytest.mark.parametrize(
    ("method", "error", "produced_before"),
    # commit_transaction fails after the transaction's records were produced; produce
    # fails on the first of them
    [("commit_transaction", ABORTABLE, True), ("produce", STATE, False)],
)
def test_an_aborted_transaction_is_done_again_without_running_the_batch_again(
    method: str, error: KafkaError, produced_before: bool
) -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        ids = submit(r)
        r.broker.fail(method, error)
        run(r, ids)
        assert r.worker._publisher is not None and r.worker._publisher.aborts == 1
        assert len(r.engine.batches) == 1  # the answers were produced again, not recomputed
        # what the aborted transaction held was produced (all its answers, or as many as
        # the loop had when it handed them over), and never committed
        answers = [record for record in r.broker.raw if record[0] == "results"]
        aborted_copies = len(answers) - len(ids)
        assert (aborted_copies > 0) == produced_before
        assert aborted_copies <= len(ids)


def test_a_transaction_failing_every_replay_is_consumed_again_from_the_decode_path() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        r.broker.append(0, b'{"custom_id": "bad"}')  # answered with 4001 while decoding
        ids = {"bad"} | submit(r)
        r.broker.fail("produce", STATE, times=REPLAYS + 1)
        run(r, ids)


def test_a_transaction_failing_every_replay_is_consumed_again_from_the_engine_stage() -> None:
    with rig(loop_config(), GatedEngine(), delivery="exactly_once") as r:
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "a batch on the engine")
        r.broker.fail("produce", STATE, times=REPLAYS + 1)
        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert len(r.engine.batches) == 2  # its partition was consumed again


def test_timeouts_in_commit_and_abort_are_retried() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        ids = submit(r)
        r.broker.fail("commit_transaction", TIMED_OUT)
        r.broker.fail("commit_transaction", ABORTABLE)
        r.broker.fail("abort_transaction", TIMED_OUT, times=2)
        run(r, ids)


def test_a_fenced_producer_makes_the_worker_rejoin_not_exit() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        ids = submit(r)
        r.broker.fail("commit_transaction", FENCED)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.unsubscribed == 1, "the worker leaving to rejoin")
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered again and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_partitions_lost_after_their_producer_was_fenced_are_dropped_quietly() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        # the transaction stays open: its commit waits at the gate
        gate = r.broker.gate("commit_transaction")
        ids = submit(r)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(
            lambda: len(r.worker.ledger) == 0 and bool(r.broker.raw),
            "every record answered, a commit in flight",
        )
        r.broker.fence("batchpipe.batchpipe.requests.0")  # P0's new owner took over
        gate.set()  # the commit goes on, and fails: fenced
        r.consumer.rebalance("lost", [P0, P1])
        r.step_until(lambda: not r.consumer.rebalancing, "the rebalance")
        assert r.answers() == Counter()  # nothing was committed

        # assigned again, the worker builds a new producer and answers everything again
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered again and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_at_least_once_sends_a_timed_out_delivery_again() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="at_least_once") as r:
        ids = submit(r)
        r.broker.fail("delivery", KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), times=2)
        run(r, ids)


def test_at_least_once_stops_on_a_delivery_that_cannot_succeed() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="at_least_once") as r:
        ids = submit(r)
        denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized")
        r.broker.fail("delivery", denied)
        with pytest.raises(FatalKafkaError, match="not authorized"):
            run(r, ids)
