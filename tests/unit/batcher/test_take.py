"""Example tests of DynamicBatcher.take: requests for the room of an in-flight engine."""

from __future__ import annotations

from batcher import BatchLimits, DynamicBatcher
from batcher.tiers import FLEX_TAG

from .test_core import FIFO, item, keys

FORMED = BatchLimits(
    max_batch_size=8, max_batch_tokens=100, timeout_s=0.1, length_aware=True, shared_prefix=True
)


def test_room_filled_by_the_queue_releases_at_once() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    for k in "abc":
        b.add(item(k), 0.0)
    assert b.take(0.0, sequences=4, tokens=100) is None  # room for 4, 3 queued: wait
    batch = b.take(0.0, sequences=2, tokens=100)  # room for 2: full
    assert keys(batch) == ["a", "b"] and batch is not None and batch.reason == "full"
    assert [i.key for i in b.running()] == ["a", "b"]


def test_a_request_waits_at_most_timeout_while_the_engine_has_room() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a", arrival=0.0), 0.0)
    assert b.take(0.09, sequences=8, tokens=100) is None
    batch = b.take(0.1, sequences=8, tokens=100)
    assert keys(batch) == ["a"] and batch is not None and batch.reason == "timeout"


def test_flush_takes_everything_without_waiting() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    for k in "abc":
        b.add(item(k), 0.0)
    assert b.take(0.0, sequences=8, tokens=30) is None  # 10 tokens each: room for all
    batch = b.take(0.0, sequences=8, tokens=30, flush=True)
    assert keys(batch) == ["a", "b", "c"] and batch is not None and batch.reason == "flush"


def test_more_tokens_queued_than_room_releases_what_fits() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    for k in "abc":
        b.add(item(k), 0.0)
    batch = b.take(0.0, sequences=8, tokens=25)
    assert keys(batch) == ["a", "b"] and batch is not None and batch.reason == "full"


def test_no_room_takes_nothing() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("a"), 0.0)
    assert b.take(1.0, sequences=0, tokens=100, flush=True) is None
    assert len(b) == 1


def test_the_anchor_waits_for_token_room_and_is_not_overtaken() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FORMED)
    b.add(item("big", arrival=0.0, prompt=40, gen=40), 0.0)
    b.add(item("small", arrival=0.01, prompt=2, gen=2), 0.01)
    assert b.take(1.0, sequences=8, tokens=50, flush=True) is None  # 80 needed, 50 free
    assert [i.key for i in b.queued()] == ["big", "small"]
    assert keys(b.take(1.0, sequences=8, tokens=84, flush=True)) == ["big", "small"]


def test_formation_chooses_among_the_queue_for_a_small_room() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FORMED)
    b.add(item("anchor", arrival=0.0, prompt=10, prefix_key=b"p"), 0.0)
    b.add(item("other", arrival=0.01, prompt=10, prefix_key=b"q"), 0.0)
    b.add(item("far", arrival=0.02, prompt=60, prefix_key=b"p"), 0.0)
    b.add(item("same", arrival=0.03, prompt=11, prefix_key=b"p"), 0.0)
    # room for two: the anchor, then the one sharing its prefix and closest in length
    assert keys(b.take(0.0, sequences=2, tokens=100)) == ["anchor", "same"]


def test_priority_with_aging_decides_the_anchor() -> None:
    limits = BatchLimits(max_batch_size=8, max_batch_tokens=100, priority_aging_s=1.0)
    b: DynamicBatcher[str] = DynamicBatcher(limits)
    b.add(item("old-low", arrival=0.0), 0.0)
    b.add(item("new-high", arrival=0.5, priority=1), 0.5)  # virtual arrival -0.5: first
    assert keys(b.take(0.5, sequences=1, tokens=100)) == ["new-high"]
    b.add(item("late-high", arrival=1.5, priority=1), 1.5)  # virtual arrival 0.5: after
    assert keys(b.take(1.5, sequences=1, tokens=100)) == ["old-low"]


def test_taken_requests_complete_with_their_dedup_followers() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO, dedup=True)
    b.add(item("lead", dedup_key=b"same"), 0.0)
    assert b.add(item("copy", partition=1, dedup_key=b"same"), 0.0)  # a follower
    batch = b.take(0.0, sequences=1, tokens=100)
    assert keys(batch) == ["lead"]
    assert [i.key for i in b.complete("lead")] == ["lead", "copy"]
    assert b.in_flight() == 0


def test_next_batch_is_take_with_a_whole_batch_of_room() -> None:
    a: DynamicBatcher[str] = DynamicBatcher(FORMED)
    b: DynamicBatcher[str] = DynamicBatcher(FORMED)
    for n in range(12):
        spec = item(f"r{n}", arrival=n / 100, prompt=3 + 7 * n % 23, gen=n % 5)
        a.add(spec, 0.0)
        b.add(spec, 0.0)
    assert keys(a.next_batch(0.2)) == keys(b.take(0.2, sequences=8, tokens=100))


def test_a_closed_flex_tier_passes_flex_requests_by_and_keeps_their_places() -> None:
    """Capacity.flex false (a remote server under pressure): the other tiers' requests
    go by the same rules as if the flex ones were not queued; those keep their order."""
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("f1", arrival=0.0, tag=FLEX_TAG), 0.0)
    b.add(item("f2", arrival=0.0, tag=FLEX_TAG + 1), 0.0)
    assert b.take(5.0, sequences=8, tokens=100, flush=True, flex=False) is None
    b.add(item("d1", arrival=1.0, tag=3.0), 1.0)
    b.add(item("u", arrival=1.0), 1.0)  # untagged (a raw producer's): not flex
    assert b.take(1.05, sequences=8, tokens=100, flex=False) is None  # not due: its own wake
    batch = b.take(1.1, sequences=8, tokens=100, flex=False)  # the oldest of them timed out
    assert keys(batch) == ["d1", "u"] and batch is not None and batch.reason == "timeout"
    b.add(item("d2", arrival=2.0, tag=4.0), 2.0)
    assert keys(b.take(2.0, sequences=1, tokens=100, flex=False)) == ["d2"]  # full: 1 room
    assert keys(b.take(2.0, sequences=8, tokens=100, flush=True)) == ["f1", "f2"]


def test_a_closed_flex_tier_counts_only_the_other_tokens_as_queued() -> None:
    b: DynamicBatcher[str] = DynamicBatcher(FIFO)
    b.add(item("f", arrival=0.0, prompt=40, gen=40, tag=FLEX_TAG), 0.0)
    b.add(item("d", arrival=0.0, tag=1.0), 0.0)
    # 90 tokens queued, 50 of room: full with flex; without it 10 fit, so it waits
    assert b.take(0.0, sequences=8, tokens=50, flex=False) is None
    assert keys(b.take(0.0, sequences=8, tokens=50, flex=False, flush=True)) == ["d"]
