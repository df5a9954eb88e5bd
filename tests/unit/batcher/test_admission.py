"""Admission: prefetch_count bounds the requests in the worker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import Admission


def test_fills_up_and_drains() -> None:
    gate = Admission(prefetch_count=3)
    gate.acquire(2)
    assert gate.has_room() and gate.room == 1
    gate.acquire()
    assert not gate.has_room() and gate.inflight == 3 and gate.peak == 3
    with pytest.raises(ValueError, match="in flight"):
        gate.acquire()
    gate.release(3)
    assert gate.has_room() and gate.inflight == 0 and gate.peak == 3


def test_rejects_misuse() -> None:
    with pytest.raises(ValueError):
        Admission(0)
    gate = Admission(2)
    with pytest.raises(ValueError):
        gate.release()
    with pytest.raises(ValueError):
        gate.acquire(-1)
    with pytest.raises(ValueError):
        gate.release(-1)


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 64), ops=st.lists(st.integers(-8, 8), max_size=50))
def test_inflight_never_exceeds_the_limit(limit: int, ops: list[int]) -> None:
    gate = Admission(limit)
    expected = peak = 0
    for n in ops:
        if n >= 0:
            if expected + n <= limit:
                gate.acquire(n)
                expected += n
            else:
                with pytest.raises(ValueError, match="in flight"):
                    gate.acquire(n)
        elif -n <= expected:
            gate.release(-n)
            expected += n
        peak = max(peak, expected)
        assert gate.inflight == expected and gate.peak == peak
        assert 0 <= gate.inflight <= gate.limit
        assert gate.has_room() == (expected < limit)


def test_lent_slots_admit_beyond_the_limit_and_are_taken_back() -> None:
    gate = Admission(4)
    gate.acquire(4)
    assert not gate.has_room()
    gate.lent = 3  # three of them are flex requests held back
    assert gate.room == 3 and gate.has_room()
    gate.acquire(3)
    with pytest.raises(ValueError, match=r"\+3 lent"):
        gate.acquire(1)
    gate.lent = 99  # never more than the limit
    assert gate.lent == 4 and gate.room == 1
    gate.lent = 0  # flex starts again: nothing admitted until back within the limit
    assert gate.room == -3 and not gate.has_room()
    gate.release(4)
    assert gate.room == 1 and gate.has_room()
