"""The fleet's models from announcements: who counts as serving, and what is refused."""

from __future__ import annotations

import pytest

from batchpipe.fleet import alive, apply_record, not_served
from worker.obs.announce import ALIVE_S, Announcement


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
    apply_record(announced, b"w1", announcement("w1", "a", 5.0).encode())
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
