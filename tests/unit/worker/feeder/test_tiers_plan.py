"""Service tiers in the feeder's planning (worker/feeder/plan.py, headers.py): the tier
travels as ``batchpipe-tier`` on each pending record, an unknown or oversized one is read
as ``default``, and a step feeds priority batches first and flex ones last."""

from __future__ import annotations

from collections import Counter

from batcher.tiers import DEFAULT, FLEX, PRIORITY
from tests.unit.worker.feeder.test_quarantine import Feeder, record
from worker.feeder.headers import TIER_HEADER, scheduled_as
from worker.feeder.naming import check_tier, pending_headers


def test_the_tier_header_is_read_with_a_bound() -> None:
    def tier(value: bytes | None) -> str:
        headers = pending_headers("b", 1.0, "k")
        return scheduled_as(headers if value is None else [*headers, (TIER_HEADER, value)]).tier

    assert tier(None) == DEFAULT
    assert tier(b"flex") == FLEX and tier(b"priority") == PRIORITY
    for bad in (b"express", b"Priority", b"\xff\xfe", b"flex" * 100, b""):
        assert tier(bad) == DEFAULT
    assert (TIER_HEADER, b"flex") in pending_headers("b", 1.0, tier="flex")
    assert all(name != TIER_HEADER for name, _ in pending_headers("b", 1.0, tier="default"))


def test_a_publisher_refuses_an_unknown_tier() -> None:
    try:
        check_tier("express")
    except ValueError as exc:
        assert "priority, default, flex" in str(exc)
    else:
        raise AssertionError("an unknown tier was accepted")


def test_a_step_feeds_priority_first_and_flex_only_when_nothing_else_waits() -> None:
    flex = [record(o, "idle", batchpipe_tier=b"flex") for o in range(0, 8)]
    bulk = [record(o, "bulk") for o in range(8, 40)]
    urgent = [record(o, "urgent", batchpipe_tier=b"priority") for o in range(40, 48)]
    feeder = Feeder([*flex, *bulk, *urgent])
    feeder.planner.note(flex)
    first = feeder.planner.plan(4, 16)  # the fleet is idle: flex takes it
    assert [b for b, _ in first.slices] == ["idle"] and first.by_tier == Counter({FLEX: 4})
    feeder.planner.note([*bulk, *urgent])
    order: list[str] = []
    fed: Counter[str] = Counter()
    for _ in range(40):
        step = feeder.planner.plan(4, 16)
        order.extend(b for b, records in step.slices for _ in records)
        fed.update(step.by_tier)
    assert fed == Counter({PRIORITY: 8, DEFAULT: 32, FLEX: 4})
    # urgent's allowance (half of each step's room) ahead of bulk; idle after both
    assert order.index("urgent") == 0
    assert max(i for i, b in enumerate(order) if b != "idle") < order.index("idle")
