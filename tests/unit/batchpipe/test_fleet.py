"""The fleet's models from announcements: who counts as serving, and what is refused."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchpipe import fleet
from batchpipe.fleet import MAX_WORKERS, alive, apply_record, not_served
from worker.obs.announce import ALIVE_S, MAX_NAME_CHARS, Announcement


def announcement(worker: str, model: str, at: float) -> Announcement:
    return Announcement(worker, model, f"{model}.requests", "g", ("chat",), at)


def test_a_worker_counts_while_its_last_announcement_is_younger_than_alive_s() -> None:
    announced = {
        "w1": announcement("w1", "a", at=1000.0),
        "w2": announcement("w2", "a", at=1000.0 - ALIVE_S),  # silent too long
        "w3": announcement("w3", "b", at=990.0),
    }
    served = alive(announced, now=1000.0)
    assert {m: [w.worker_id for w in ws] for m, ws in served.items()} == {"a": ["w1"], "b": ["w3"]}


def test_a_tombstone_withdraws_a_worker_and_garbage_is_ignored() -> None:
    announced: dict[str, Announcement] = {}
    apply_record(announced, b"w1", announcement("w1", "a", time.time()).encode())
    apply_record(announced, b"w2", b"not json")
    apply_record(announced, None, announcement("w9", "z", 5.0).encode())  # no key: nobody's
    assert list(announced) == ["w1"]
    apply_record(announced, b"w1", None)
    assert announced == {}


@pytest.mark.parametrize(
    ("models", "served", "refused"),
    [
        ({"gpt-4o-mini"}, {"echo"}, True),
        ({"echo"}, {"echo", "other"}, False),
        ({""}, {"echo"}, False),  # no model named: any worker answers it
        ({"gpt-4o-mini"}, set(), False),  # nothing announced: nothing is known, nothing refused
    ],
)
def test_a_model_is_refused_only_when_others_are_known_to_be_served(
    models: set[str], served: set[str], refused: bool
) -> None:
    why = not_served(models, served)
    assert (why is not None) == refused
    if why is not None:
        assert "'gpt-4o-mini'" in why and "'echo'" in why


def test_an_announcement_round_trips_and_an_oversized_one_is_refused() -> None:
    item = announcement("w1", "a", 12.5)
    assert Announcement.decode(item.encode()) == item
    assert Announcement.decode(b"{" + b" " * 70_000 + b"}") is None


def test_a_refusal_is_bounded_whatever_the_names() -> None:
    long_name = "ü" * 100_000
    served = {f"model-{i}" for i in range(5_000)}
    why = not_served({long_name, "x"}, served)
    assert why is not None and len(why) < 2_000
    assert "100000 characters" in why and "'x'" in why and "more" in why


def test_announcements_out_of_bounds_read_as_none() -> None:
    fine = announcement("w1", "a", 5.0)
    assert Announcement.decode(replace(fine, model="m" * (MAX_NAME_CHARS + 1)).encode()) is None
    assert Announcement.decode(replace(fine, endpoints=("chat",) * 17).encode()) is None
    for at in ("1e400", "-1e400", "NaN", "Infinity"):
        value = fine.encode().replace(b'"at": 5.0', b'"at": ' + at.encode())
        assert Announcement.decode(value) is None, at
    assert not announcement("w1", "a", 1000.0 + ALIVE_S).alive(now=1000.0)  # far future
    assert announcement("w1", "a", 1001.0).alive(now=1000.0)  # a clock a second ahead


@settings(max_examples=200, deadline=None)
@given(key=st.one_of(st.none(), st.binary(max_size=2_000)), value=st.one_of(st.none(), st.binary()))
def test_any_record_leaves_the_fleet_readable(key: bytes | None, value: bytes | None) -> None:
    announced = {"w1": announcement("w1", "a", time.time())}
    apply_record(announced, key, value)
    for workers in alive(announced, time.time()).values():
        assert all(abs(int(w.at) - time.time()) < ALIVE_S + 1 for w in workers)


def test_a_flood_of_worker_ids_is_held_to_max_workers_dead_ones_first() -> None:
    now = time.time()
    announced: dict[str, Announcement] = {}
    # what a long-lived fleet's killed workers leave on the compacted topic: never held
    for i in range(3 * MAX_WORKERS):
        apply_record(announced, f"dead{i}".encode(), announcement(f"d{i}", "a", now - 99).encode())
    apply_record(announced, b"live", announcement("live", "b", now).encode())
    assert list(announced) == ["live"]
    # workers that fell silent since they were taken are swept when the table is full
    announced |= {f"gone{i}": announcement(f"g{i}", "a", now - 99) for i in range(MAX_WORKERS)}
    fleet.__dict__["_next_sweep"] = 0.0
    apply_record(announced, b"new", announcement("new", "c", now).encode())
    assert sorted(announced) == ["live", "new"]
    for i in range(2 * MAX_WORKERS):
        apply_record(announced, f"forged{i}".encode(), announcement(f"f{i}", "z", now).encode())
    assert len(announced) == MAX_WORKERS and {"live", "new"} <= set(announced)
    apply_record(announced, b"k" * 100_000, announcement("k", "k", now).encode())
    assert len(announced) == MAX_WORKERS
