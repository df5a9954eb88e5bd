"""Consumer lag measured from offsets on the in-memory consumer: paused partitions, partitions
nothing was read from yet, and partitions whose end offset the broker does not tell."""

from __future__ import annotations

from ..fakes import GatedEngine
from ..rig import P0, P1, TOPIC, Rig, loop_config, rig


def submit(r: Rig, per_partition: int) -> set[str]:
    ids = set()
    for p in (0, 1):
        for i in range(per_partition):
            r.broker.submit(p, f"p{p}-{i}", f"hello {p} {i}")
            ids.add(f"p{p}-{i}")
    return ids


def exposed_lag(r: Rig) -> tuple[dict[int, float | None], float | None]:
    """``batchpipe_consumer_lag`` per partition, and the unknown-partitions gauge."""
    registry = r.worker.metrics.registry
    lags = {
        p: registry.get_sample_value(
            "batchpipe_consumer_lag", {"topic": TOPIC, "partition": str(p)}
        )
        for p in (0, 1)
    }
    return lags, registry.get_sample_value("batchpipe_consumer_lag_unknown_partitions")


def test_lag_counts_the_backlog_of_paused_partitions_until_it_is_answered() -> None:
    with rig(loop_config(prefetch_count=2, max_batch_size=2), GatedEngine()) as r:
        ids = submit(r, per_partition=6)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.paused() == {P0, P1}, "the partitions paused")
        # two records on the engine, ten unread, some of a partition nothing was read from
        assert r.worker.lag.measure() == {P0: 6, P1: 6}
        assert exposed_lag(r) == ({0: 6, 1: 6}, 0)
        assert r.worker.metrics.snapshot().total_lag == 12

        r.engine.open()
        r.step_until(lambda: r.settled(ids), "every record answered and committed")
        assert r.worker.lag.measure() == {P0: 0, P1: 0}
        assert exposed_lag(r) == ({0: 0, 1: 0}, 0)


def test_a_partition_whose_end_offset_is_unknown_is_counted_not_read_as_0() -> None:
    with rig(loop_config(), GatedEngine()) as r:
        submit(r, per_partition=3)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.delivered == 6, "every record read")

        r.consumer.unreachable = {P1}
        assert r.worker.lag.measure() == {P0: 3, P1: None}
        assert exposed_lag(r) == ({0: 3, 1: None}, 1)
        snapshot = r.worker.metrics.snapshot()
        assert (snapshot.total_lag, snapshot.lag_unknown_partitions) == (3, 1)

        # once one query goes unanswered the rest of that measurement is not asked for
        r.consumer.unreachable = {P0}
        assert r.worker.lag.measure() == {P0: None, P1: None}
        assert exposed_lag(r) == ({0: None, 1: None}, 2)

        r.consumer.unreachable = set()
        assert r.worker.lag.measure() == {P0: 3, P1: 3}
        assert exposed_lag(r) == ({0: 3, 1: 3}, 0)
