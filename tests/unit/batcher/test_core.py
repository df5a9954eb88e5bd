"""Example tests of DynamicBatcher: release rules, dedup, expiry, revoke, requeue."""

from __future__ import annotations

import pytest

from batcher import Batch, BatchLimits, DynamicBatcher, Pending
from batcher.batcher import FORMATION_WINDOW

FIFO = BatchLimits(
    max_batch_size=4, max_batch_tokens=100, timeout_s=0.1, length_aware=False, shared_prefix=False
)


def item(
    key: str,
    arrival: float = 0.0,
    prompt: int = 5,
    gen: int = 5,
    partition: int = 0,
    **kw: object,
) -> Pending[str]:
    return Pending(
        key=key,
        partition=("requests", partition),
        offset=0,
        prompt_tokens=prompt,
        max_tokens=gen,
        arrival=arrival,
        payload=key,
        **kw,  # type: ignore[arg-type]
    )


def keys(batch: Batch[str] | None) -> list[str]:
    assert batch is not None
    return [i.key for i in batch.items]


def test_waits_until_timeout_then_releases_everything_queued() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a", 0.0), 0.0)
    b.add(item("b", 0.05), 0.05)
    assert b.next_batch(0.09) is None
    assert b.wake_at() == pytest.approx(0.1)
    batch = b.next_batch(0.1)
    assert keys(batch) == ["a", "b"]
    assert batch is not None and batch.reason == "timeout" and batch.formed_at == 0.1
    assert len(b) == 0 and b.in_flight() == 2 and b.wake_at() is None


def test_wake_at_is_exactly_when_next_batch_releases() -> None:
    # 0.7 + 0.1 - 0.7 < 0.1 in floating point: the comparison must not subtract.
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a", 0.7), 0.7)
    wake = b.wake_at()
    assert wake is not None
    assert b.next_batch(wake) is not None


def test_full_by_count_releases_at_once() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    for n in range(5):
        b.add(item(f"r{n}", n * 0.001), 0.0)
    batch = b.next_batch(0.004)
    assert keys(batch) == ["r0", "r1", "r2", "r3"]
    assert batch is not None and batch.reason == "full"
    assert b.next_batch(0.004) is None  # r4 alone waits for its timeout


def test_full_by_tokens_releases_what_fits() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a", 0.0, prompt=40, gen=20), 0.0)
    assert b.next_batch(0.0) is None
    b.add(item("b", 0.01, prompt=30, gen=20), 0.01)
    batch = b.next_batch(0.01)
    assert keys(batch) == ["a"]
    assert batch is not None and batch.reason == "full" and batch.tokens == 60


def test_flush_drains_without_waiting() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a"), 0.0)
    assert b.next_batch(0.0) is None
    batch = b.next_batch(0.0, flush=True)
    assert keys(batch) == ["a"] and batch is not None and batch.reason == "flush"
    assert b.next_batch(0.0, flush=True) is None


def test_over_limit_is_a_caller_bug_and_not_kept() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    with pytest.raises(ValueError, match=r"'huge' needs 101 tokens.*max_batch_tokens=100"):
        b.add(item("huge", prompt=90, gen=11), 0.0)
    assert b.in_flight() == 0
    b.add(item("exact", prompt=90, gen=10), 0.0)  # exactly the limit is fine
    assert b.in_flight() == 1


def test_duplicate_key_in_flight_is_a_caller_bug() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a"), 0.0)
    with pytest.raises(ValueError, match="already in flight"):
        b.add(item("a"), 0.0)


def test_priority_first_fifo_within_priority() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("low0", 0.00), 0.0)
    b.add(item("high0", 0.01, priority=5), 0.0)
    b.add(item("low1", 0.02), 0.0)
    b.add(item("high1", 0.03, priority=5), 0.0)
    b.max_batch_size = 3
    assert keys(b.next_batch(0.03)) == ["high0", "high1", "low0"]


def test_effective_size_is_bounded_by_the_limit() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    with pytest.raises(ValueError):
        b.max_batch_size = 5
    with pytest.raises(ValueError):
        b.max_batch_size = 0
    b.max_batch_size = 2
    for n in range(3):
        b.add(item(f"r{n}"), 0.0)
    assert keys(b.next_batch(0.0)) == ["r0", "r1"]


def test_dedup_follower_rides_on_the_leader() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    assert b.add(item("lead", dedup_key=b"x"), 0.0) is False
    assert b.add(item("same", 0.01, dedup_key=b"x"), 0.0) is True
    assert b.add(item("other", 0.02, dedup_key=b"y"), 0.0) is False
    assert len(b) == 2 and b.in_flight() == 3
    assert keys(b.next_batch(1.0)) == ["lead", "other"]
    # joins a running leader too
    assert b.add(item("late", 1.0, dedup_key=b"x"), 1.0) is True
    assert [i.key for i in b.complete("lead")] == ["lead", "same", "late"]
    assert [i.key for i in b.complete("other")] == ["other"]
    assert b.in_flight() == 0
    # the key is free again: a new request with it leads
    assert b.add(item("again", 2.0, dedup_key=b"x"), 2.0) is False


def test_dedup_disabled_runs_everything() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO, dedup=False)
    assert b.add(item("a", dedup_key=b"x"), 0.0) is False
    assert b.add(item("b", dedup_key=b"x"), 0.0) is False
    assert keys(b.next_batch(1.0)) == ["a", "b"]


def test_complete_of_a_queued_key_is_refused_and_of_a_dropped_key_is_empty() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a"), 0.0)
    with pytest.raises(ValueError, match="not running"):
        b.complete("a")
    b.next_batch(1.0)
    assert [i.key for i in b.drop_partitions([("requests", 0)])] == ["a"]
    assert b.complete("a") == []


def test_expired_queued_items_leave_running_ones_stay() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("run", 0.0, deadline=0.5), 0.0)
    b.next_batch(0.0, flush=True)
    b.add(item("wait", 0.1, deadline=0.5), 0.1)
    b.add(item("free", 0.1), 0.1)
    assert b.pop_expired(0.5) == []  # deadline < now, strictly
    assert [i.key for i in b.pop_expired(0.6)] == ["wait"]
    assert [i.key for i in b.queued()] == ["free"]
    assert [i.key for i in b.complete("run")] == ["run"]


def test_expired_leader_hands_over_to_a_follower_in_time() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("lead", 0.0, dedup_key=b"x", deadline=1.0), 0.0)
    b.add(item("f1", 0.1, dedup_key=b"x", deadline=1.5), 0.1)
    b.add(item("f2", 0.2, dedup_key=b"x", deadline=3.0), 0.2)
    b.add(item("f3", 0.3, dedup_key=b"x"), 0.3)
    assert [i.key for i in b.pop_expired(2.0)] == ["lead", "f1"]
    assert [i.key for i in b.queued()] == ["f2"]
    assert keys(b.next_batch(2.0)) == ["f2"]
    assert [i.key for i in b.complete("f2")] == ["f2", "f3"]


def test_follower_of_a_queued_leader_expires_alone() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("lead", 0.0, dedup_key=b"x"), 0.0)
    b.add(item("f", 0.1, dedup_key=b"x", deadline=0.2), 0.1)
    assert [i.key for i in b.pop_expired(0.3)] == ["f"]
    b.next_batch(1.0)
    assert [i.key for i in b.complete("lead")] == ["lead"]


def test_already_expired_item_does_not_join_a_leader() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("lead", 0.0, dedup_key=b"x"), 0.0)
    assert b.add(item("late", 1.0, dedup_key=b"x", deadline=0.5), 1.0) is False
    assert [i.key for i in b.pop_expired(1.0)] == ["late"]


def test_revoke_promotes_a_follower_from_another_partition() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("lead", 0.0, partition=0, dedup_key=b"x"), 0.0)
    b.add(item("f0", 0.1, partition=0, dedup_key=b"x"), 0.1)
    b.add(item("f1", 0.2, partition=1, dedup_key=b"x"), 0.2)
    b.add(item("f2", 0.3, partition=2, dedup_key=b"x"), 0.3)
    b.next_batch(1.0)  # lead is running
    dropped = b.drop_partitions([("requests", 0)])
    assert sorted(i.key for i in dropped) == ["f0", "lead"]
    assert [i.key for i in b.queued()] == ["f1"]
    assert b.complete("lead") == []
    assert keys(b.next_batch(2.0)) == ["f1"]
    assert [i.key for i in b.complete("f1")] == ["f1", "f2"]
    assert b.in_flight() == 0


def test_revoke_removes_followers_of_surviving_leaders() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("lead", 0.0, partition=1, dedup_key=b"x"), 0.0)
    b.add(item("f0", 0.1, partition=0, dedup_key=b"x"), 0.1)
    b.add(item("q0", 0.2, partition=0), 0.2)
    assert sorted(i.key for i in b.drop_partitions([("requests", 0)])) == ["f0", "q0"]
    b.next_batch(1.0)
    assert [i.key for i in b.complete("lead")] == ["lead"]


def test_requeue_puts_items_back_in_their_place() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    for n in range(4):
        b.add(item(f"r{n}", n * 0.01), 0.0)
    batch = b.next_batch(0.03)
    assert batch is not None
    b.add(item("r4", 0.04), 0.04)
    b.requeue(batch.items[2:])
    b.requeue([item("unknown")])  # not running: ignored
    assert [i.key for i in b.queued()] == ["r2", "r3", "r4"]
    assert [i.arrival for i in b.queued()] == [0.02, 0.03, 0.04]
    # the requeued items are old: they go at once
    assert keys(b.next_batch(0.13)) == ["r2", "r3", "r4"]


def test_batch_padding_figures() -> None:
    batch = Batch(
        items=(item("a", prompt=10, gen=1), item("b", prompt=6, gen=1), item("c", prompt=4)),
        reason="full",
        formed_at=0.0,
    )
    assert batch.size == 3 and batch.prompt_tokens == 20 and batch.longest_prompt == 10
    assert batch.padding == 10 and batch.padding_waste == pytest.approx(0.5)
    assert batch.tokens == 27 and batch.token_fill(54) == pytest.approx(0.5)
    assert batch.size_fill(4) == pytest.approx(0.75)


def test_limits_and_items_are_validated() -> None:
    with pytest.raises(ValueError):
        BatchLimits(max_batch_size=0)
    with pytest.raises(ValueError):
        BatchLimits(max_batch_tokens=0)
    with pytest.raises(ValueError):
        BatchLimits(timeout_s=-1)
    with pytest.raises(ValueError):
        item("neg", prompt=-1)


def test_formation_chooses_among_the_most_due_window_of_a_deep_queue() -> None:
    # a deep queue (prefetch_count 4096) is not ranked whole for every batch: the anchor's
    # best length match beyond the window waits its turn, one inside it is taken
    limits = BatchLimits(
        max_batch_size=2,
        max_batch_tokens=100_000,
        timeout_s=0.1,
        length_aware=True,
        shared_prefix=False,
    )
    b: DynamicBatcher[str] = DynamicBatcher(limits)
    b.add(item("anchor", 0.0, prompt=500), 0.0)
    for i in range(2 * FORMATION_WINDOW):
        b.add(item(f"q{i}", 1.0 + i, prompt=10), 0.0)
    b.add(item("far twin", 10_000.0, prompt=500), 0.0)
    # ranked whole, the queue would pair the anchor with its twin at the far end
    assert keys(b.next_batch(20_000.0)) == ["anchor", "q0"]
    b.add(item("anchor 2", 0.5, prompt=500), 0.0)
    b.add(item("near twin", 3.5, prompt=500), 0.0)
    assert keys(b.next_batch(20_000.0)) == ["anchor 2", "near twin"]
