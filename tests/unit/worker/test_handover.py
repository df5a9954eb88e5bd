"""Exactly one answer on the results topic through rebalances and lost generations (issue 40).

The worker loop with the real transactional publisher on fake producers. ``broker.sent`` is
what a read_committed reader of the results topic sees, ``broker.raw`` every record
produced (aborted ones too): both are counted here, never after a dedup.

The duplicate of issue 40: an answer beyond its partition's committable position (a
longer request before it still runs) was published with the next commit; a revoke then
handed the partition over at that position, and the next owner answered the record again.
Issue 48 publishes such an answer at once all the same: the transaction's progress record
tells the next owner to skip it (docs/architecture.md §2 "Answers on completion").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from confluent_kafka import KafkaError

from batcher import Progress
from worker.kafka.progress import progress_topic
from worker.wire.progress import decode_progress

from .fakes import GatedInFlightEngine
from .rig import P0, P1, RESULTS, Rig, loop_config, rig

SLOW = "a long request"


def raw_answers(r: Rig[GatedInFlightEngine]) -> Counter[str]:
    """custom_ids of every result record produced, committed or aborted."""
    return Counter(
        key if isinstance(key, str) else (key or b"").decode()
        for topic, key, _, _ in r.broker.raw
        if topic == RESULTS
    )


def straggler_first(r: Rig[GatedInFlightEngine]) -> set[str]:
    """Partition 0: a long request at offset 0, two short ones after it; partition 1: one."""
    r.broker.submit(0, "slow", SLOW)
    r.broker.submit(0, "a", "short a")
    r.broker.submit(0, "b", "short b")
    r.broker.submit(1, "c", "short c")
    r.engine.stragglers.add(SLOW)
    return {"slow", "a", "b", "c"}


def answered_but_the_long_one(r: Rig[GatedInFlightEngine]) -> set[str]:
    """:func:`straggler_first`, assigned and stepped until only the long request runs."""
    ids = straggler_first(r)
    r.consumer.rebalance("assign", [P0, P1])
    r.step_until(lambda: len(r.worker.ledger) == 1, "every request but the long one answered")
    return ids


def pointed(r: Rig[GatedInFlightEngine], number: int) -> Progress | None:
    """What the group's pointer says of requests partition ``number`` (None: no pointer)."""
    topic = progress_topic("requests")
    pointer = r.broker.committed.get((topic, number))
    if pointer is None:
        return None
    value = r.broker.stored[(topic, number)][pointer - 1]
    return decode_progress("batchpipe", ("requests", number), value)


def test_an_answer_ahead_of_a_straggler_is_published_at_once_and_skipped_by_the_next_owner() -> (
    None
):
    engine = GatedInFlightEngine(gated=False)
    with rig(loop_config(), engine, delivery="exactly_once") as r:
        ids = answered_but_the_long_one(r)
        # a and b are on the topic while the long request before them still runs
        r.step_until(lambda: set(r.answers()) == {"a", "b", "c"}, "the short answers visible")
        assert r.broker.committed.get(P0, 0) == 0  # the offset cannot pass the long one
        assert pointed(r, 0) == Progress(committed=0, highest=2, unanswered=(0,))

        r.consumer.rebalance("revoke", [P0, P1])
        r.step_until(lambda: not r.consumer.rebalancing, "the revoke")
        # the next owner (here: the same worker, assigned again) reads from offset 0 and
        # answers only the long request: a and b are not answered, not even decoded, again
        engine.stragglers.clear()
        submitted = len(engine.submitted)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        # the long one only, in the ledger's next generation (Source.ref)
        assert [k.split("#")[0] for k in engine.submitted[submitted:]] == ["requests/0/0"]
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert raw_answers(r) == Counter(dict.fromkeys(ids, 1))
        assert pointed(r, 0) == Progress(committed=3, highest=2)
        skipped = r.worker.metrics.registry.get_sample_value("batchpipe_answered_before_total")
        assert skipped == 2  # a and b, counted for the operator


def test_a_progress_record_that_disagrees_with_the_committed_offset_skips_nothing() -> None:
    engine = GatedInFlightEngine(gated=False)
    with rig(loop_config(), engine, delivery="exactly_once") as r:
        answered_but_the_long_one(r)
        r.step_until(lambda: set(r.answers()) == {"a", "b", "c"}, "the short answers visible")
        r.consumer.rebalance("revoke", [P0, P1])
        r.step_until(lambda: not r.consumer.rebalancing, "the revoke")
        # the operator deletes and recreates the requests topic: the group's offsets of it
        # are gone, the progress pointers stay (the record says offsets 1 and 2 answered)
        r.broker.logs[P0].clear()
        del r.broker.committed[P0]
        fresh = {"x0", "x1", "x2"}
        for custom_id in sorted(fresh):
            r.broker.submit(0, custom_id, f"new {custom_id}")
        engine.stragglers.clear()
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: set(r.answers()) >= fresh, "every new record answered")
        assert {i: r.answers()[i] for i in fresh} == dict.fromkeys(fresh, 1)


def test_every_transaction_points_the_group_at_its_progress_records() -> None:
    engine = GatedInFlightEngine(gated=False)
    with rig(loop_config(), engine, delivery="exactly_once") as r:
        ids = answered_but_the_long_one(r)
        engine.stragglers.clear()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert raw_answers(r) == Counter(dict.fromkeys(ids, 1))
        topic = progress_topic("requests")
        for _, _, offsets in r.broker.transactions:
            moved = {p for t, p, _ in offsets if t == "requests"}
            pointers = {p for t, p, _ in offsets if t == topic}
            # every partition whose offset moved got a progress record and a pointer
            # (settling transactions re-send offsets only); every one carried offsets
            assert offsets and (moved <= pointers or not pointers)
        assert pointed(r, 0) == Progress(committed=3, highest=2)
        assert pointed(r, 1) == Progress(committed=1, highest=0)


def test_a_fenced_producer_is_a_lost_generation_the_worker_rejoins() -> None:
    engine = GatedInFlightEngine(gated=False)
    with rig(loop_config(), engine, delivery="exactly_once") as r:
        ids = straggler_first(r)
        gate = r.broker.gate("commit_transaction")
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: bool(r.broker.raw), "a commit in flight")
        # meanwhile the group moved on without this worker (a pause past its session):
        # the new owner of partition 0 claimed the worker's transactional id
        r.broker.fence("batchpipe.batchpipe.requests.0")
        gate.set()
        r.step_until(lambda: r.consumer.unsubscribed == 1, "the worker leaving to rejoin")
        assert r.consumer.assignment() == []
        assert len(r.worker.ledger) == 0  # every partition forgotten
        assert r.answers() == Counter()  # the fenced transaction committed nothing
        # its progress records were written (a broker keeps them, and the embedded one
        # shows them), but no pointer names them: a zombie's progress never counts
        assert r.broker.stored.get((progress_topic("requests"), 0))
        assert pointed(r, 0) is None and pointed(r, 1) is None

        engine.stragglers.clear()
        r.consumer.rebalance("assign", [P0, P1])  # the next generation
        r.step_until(lambda: r.settled(ids), "every record answered again and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert not r.worker.engine_stage.wedged  # the same engine served on


def test_a_commit_refused_by_generation_is_a_lost_generation_too() -> None:
    illegal = KafkaError(KafkaError.ILLEGAL_GENERATION, "stale generation", txn_requires_abort=True)
    with rig(loop_config(), GatedInFlightEngine(gated=False), delivery="exactly_once") as r:
        r.broker.submit(0, "a", "short a")
        r.broker.fail("send_offsets_to_transaction", illegal)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.unsubscribed == 1, "the worker leaving to rejoin")
        assert r.answers() == Counter()
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled({"a"}), "answered again and committed")
        assert r.answers() == Counter({"a": 1})


def test_a_straggler_never_pauses_admission_and_a_slow_commit_does() -> None:
    config = loop_config(prefetch_count=4, max_batch_size=2)
    config = replace(config, kafka=replace(config.kafka, max_buffered_answers=3))
    engine = GatedInFlightEngine(gated=False)
    with rig(config, engine, delivery="exactly_once") as r:
        r.broker.submit(0, "slow", SLOW)
        for i in range(20):
            r.broker.submit(0, f"s{i}", f"short {i}")
        engine.stragglers.add(SLOW)
        r.consumer.rebalance("assign", [P0])
        # behind one long request, all twenty short ones are answered and visible
        shorts = {f"s{i}" for i in range(20)}
        r.step_until(lambda: set(r.answers()) == shorts, "the short answers visible")
        assert engine.running == ["requests/0/0#0"]  # the long one still runs

        # a commit that does not end holds the answers: admission stops at the bound
        gate = r.broker.gate("commit_transaction")
        gate.clear()
        for i in range(20, 30):
            r.broker.submit(0, f"s{i}", f"short {i}")
        publisher = r.worker._publisher
        assert publisher is not None
        r.step_until(publisher.full, "three answers waiting for the commit in flight")
        read = r.consumer.delivered
        for _ in range(20):
            r.worker._step(draining=False)
        assert r.consumer.delivered == read  # nothing more taken while the buffer is full
        gate.set()
        engine.stragglers.clear()
        ids = {"slow"} | {f"s{i}" for i in range(30)}
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert raw_answers(r) == Counter(dict.fromkeys(ids, 1))


def test_at_least_once_frees_a_slot_at_send_and_bounds_the_undelivered_answers() -> None:
    config = loop_config(prefetch_count=4, max_batch_size=2)
    config = replace(config, kafka=replace(config.kafka, max_buffered_answers=6))
    with rig(config, GatedInFlightEngine(gated=False), delivery="at_least_once") as r:
        r.broker.deliveries_held = True  # the broker acknowledges nothing yet
        ids = {f"s{i}" for i in range(20)}
        for i in range(20):
            r.broker.submit(0, f"s{i}", f"short {i}")
        r.consumer.rebalance("assign", [P0])
        publisher = r.worker._publisher
        assert publisher is not None
        # more answers sent than there are prefetch slots: a slot is free once sent
        r.step_until(publisher.full, "six answers waiting for their acknowledgement")
        read = r.consumer.delivered
        for _ in range(20):
            r.worker._step(draining=False)
        assert read == r.consumer.delivered < 20  # nothing more taken while full
        assert r.broker.committed.get(P0, 0) == 0  # nothing acknowledged, nothing committed
        r.broker.deliveries_held = False
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
