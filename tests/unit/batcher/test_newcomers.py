"""Newcomers first: queued requests start lowest virtual tag first, within a bound.

The feeder writes each shared record's tag (its key's virtual service since the key
became active, docs/architecture.md §10); a small batch fed after a large one carries
lower tags, so the worker runs it next instead of after everything it already holds. A tag
is anyone's input (the requests topic is writable), so it moves a request at most
``priority_aging_s`` ahead: a stream of tag-0 requests never starves a tagged or untagged
one. Times are multiples of 1/64 s so that the bound is checked exactly.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import DynamicBatcher, Pending
from tests.unit.batcher.test_aging import batcher, served

TICK = 1 / 64


def request(key: str, arrival: float, tag: float | None, priority: int = 0) -> Pending[None]:
    return Pending(
        key=key,
        partition=("requests", 0),
        offset=0,
        prompt_tokens=8,
        max_tokens=8,
        arrival=arrival,
        payload=None,
        priority=priority,
        tag=tag,
    )


def fifo(aging_s: float = 10.0, size: int = 4, timeout_s: float = 0.1) -> DynamicBatcher[None]:
    """A batcher in strict queue order (no length or prefix ranking)."""
    return batcher(aging_s, size, timeout_s, length_aware=False, shared_prefix=False)


def keys(b: DynamicBatcher[None]) -> list[str]:
    return [item.key for item in b.queued()]


def test_a_lower_tag_fed_later_is_queued_ahead_of_the_held_higher_tags() -> None:
    b = fifo()
    for n in range(6):  # a large batch's slices, fed first
        b.add(request(f"large{n}", n * TICK, tag=100.0 + 10 * (n // 2)), n * TICK)
    b.add(request("small", 8 * TICK, tag=0.0), 8 * TICK)
    b.add(request("between", 9 * TICK, tag=115.0), 9 * TICK)
    assert keys(b) == [
        "small",
        "large0",
        "large1",
        "large2",
        "large3",
        "between",
        "large4",
        "large5",
    ]
    batch = b.next_batch(1.0, flush=True)
    assert batch is not None and batch.items[0].key == "small"


def test_equal_tags_and_requests_without_a_tag_keep_arrival_order() -> None:
    b = fifo()
    for n in range(4):
        b.add(request(f"same{n}", n * TICK, tag=7.0), n * TICK)
    for n in range(3):
        b.add(request(f"none{n}", (4 + n) * TICK, tag=None), (4 + n) * TICK)
    assert keys(b) == ["same0", "same1", "same2", "same3", "none0", "none1", "none2"]
    # a tagged newcomer passes the untagged ones too (they are outside fair share)
    b.add(request("new", 8 * TICK, tag=1.0), 8 * TICK)
    assert keys(b)[0] == "new"


def test_a_tag_moves_a_request_at_most_priority_aging_s_ahead() -> None:
    b = fifo(aging_s=1.0)
    b.add(request("old", 0.0, tag=50.0), 0.0)
    b.add(request("recent", 2.5, tag=50.0), 2.5)
    b.add(request("low", 3.0, tag=0.0), 3.0)  # may go to 3.0 - 1.0 = 2.0, not to 0.0
    assert keys(b) == ["old", "low", "recent"]


def test_a_request_put_back_keeps_the_place_its_tag_gave_it() -> None:
    b = fifo(size=1)
    b.add(request("large", 0.0, tag=10.0), 0.0)
    b.add(request("small", TICK, tag=0.0), TICK)
    batch = b.next_batch(1.0, flush=True)
    assert batch is not None and [i.key for i in batch.items] == ["small"]
    b.requeue(batch.items)
    assert keys(b) == ["small", "large"]


@settings(max_examples=100, deadline=None)
@given(
    aging_ticks=st.integers(1, 64),
    timeout_ticks=st.sampled_from([0, 1, 6, 64]),
    cadence_ticks=st.integers(1, 64),
    size=st.integers(1, 4),
    backlog=st.integers(0, 10),
    victim_tag=st.sampled_from([None, 1.0, 1e300]),
)
def test_a_stream_of_tag_zero_requests_starves_nothing(
    aging_ticks: int,
    timeout_ticks: int,
    cadence_ticks: int,
    size: int,
    backlog: int,
    victim_tag: float | None,
) -> None:
    """A tenant writing tag 0 on every request (the lowest there is), enough to fill every
    batch alone: the victim is still served within the batcher's stated bound,
    ``max((P − p + 1)·s, timeout_s) + N·c`` with P = p."""
    aging_s, timeout_s, cadence_s = aging_ticks * TICK, timeout_ticks * TICK, cadence_ticks * TICK
    b = fifo(aging_s, size, timeout_s)
    for n in range(backlog):
        b.add(request(f"backlog{n}", 0.0, tag=0.0), 0.0)
    b.add(request("victim", 0.0, victim_tag), 0.0)
    steps = math.ceil((aging_s + timeout_s) / cadence_s) + backlog + size + 4

    def zero(key: str, now: float) -> Pending[None]:
        return request(key, now, tag=0.0)

    served_at, most_in_flight = served(b, "victim", zero, steps, cadence_s)
    assert served_at <= max(aging_s, timeout_s) + most_in_flight * cadence_s
