"""Where the worker starts reading a partition its group never committed: offset 0
(:data:`worker.kafka.consumer.FROM_START`), not the broker's answer for "earliest",
which the embedded Tansu broker can give too high (the batch it stored first, not the
lowest offset). ``FakeBroker.earliest`` makes the fake broker answer like that.
"""

from __future__ import annotations

from collections import Counter

from worker.kafka.committer import REPLAYS

from .fakes import GatedEngine
from .rig import P0, P1, loop_config, rig
from .test_transactions import STATE, submit


def test_a_partition_never_committed_is_read_from_offset_0_whatever_earliest_says() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        ids = submit(r, 6)
        r.broker.earliest[P0] = 2  # would skip r0 and r2
        r.broker.earliest[P1] = 1  # would skip r1
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))


def test_a_committed_partition_resumes_at_its_commit() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        ids = submit(r, 4)
        r.broker.committed[P0] = 1  # r0 was answered by an earlier owner
        r.broker.earliest[P1] = 1  # ignored: P1 starts at 0
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids - {"r0"}), "the rest answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids - {"r0"}, 1))


def test_a_rewind_before_any_commit_reads_again_from_offset_0() -> None:
    with rig(loop_config(), GatedEngine(gated=False), delivery="exactly_once") as r:
        ids = submit(r, 4)
        r.broker.earliest[P0] = 1
        r.broker.earliest[P1] = 1
        # the first transactions stay aborted: their partitions are consumed again from
        # their committed offsets, of which there are none yet
        r.broker.fail("produce", STATE, times=REPLAYS + 1)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids, 1))
        assert r.worker._publisher is not None and r.worker._publisher.aborts >= REPLAYS + 1


def test_unreadable_committed_offsets_leave_the_default_assignment() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        ids = submit(r, 4)
        r.broker.committed[P0] = 1  # r0 was answered by an earlier owner
        r.consumer.coordinator_down = True  # the worker cannot choose: librdkafka does
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled(ids - {"r0"}), "the rest answered and committed")
        assert r.answers() == Counter(dict.fromkeys(ids - {"r0"}, 1))
