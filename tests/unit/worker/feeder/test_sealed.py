"""A sealed batch is held until its end marker (worker/feeder/plan.py, issues 38 and 49):
its records wait, every other batch is fed meanwhile, the marker is never moved, a batch
whose marker never comes is abandoned after HOLD_S without a record or a heartbeat, and
one whose marker counts more records than were read is never fed."""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from tests.unit.worker.fakes import FakeMessage
from tests.unit.worker.feeder.test_quarantine import Feeder
from worker.feeder.naming import HOLD_S, alive_marker, end_marker, pending_headers, tokens_header
from worker.feeder.plan import Planner
from worker.kafka.consumer import RecordHeaders as Headers


def _record(offset: int, key: bytes | None, value: bytes | None, headers: Headers) -> Message:
    return cast(Message, FakeMessage(("pending", 0), offset, key, value, headers))


def sealed(offset: int, batch: str) -> Message:
    headers: Headers = [*pending_headers(batch, 1.0, batch, sealed=True), tokens_header(9)]
    return _record(offset, f"{batch}-{offset}".encode(), b"v", headers)


def plain(offset: int, batch: str) -> Message:
    headers: Headers = [*pending_headers(batch, 1.0, batch), tokens_header(9)]
    return _record(offset, f"{batch}-{offset}".encode(), b"v", headers)


def marker(offset: int, batch: str, count: int) -> Message:
    headers: Headers = list(end_marker(batch, 1.0, batch, count))
    return _record(offset, None, None, headers)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def held_feeder(records: list[Message], clock: Clock) -> Feeder:
    feeder = Feeder(records)
    feeder.planner = Planner(
        feeder.index, feeder.fair, feeder.ahead, feeder.drain, feeder.planner._charging, clock
    )
    return feeder


def test_a_sealed_batch_waits_for_its_marker_while_another_is_fed() -> None:
    records = [sealed(0, "big"), sealed(1, "big"), plain(2, "small"), sealed(3, "big")]
    feeder = held_feeder(records, Clock())
    feeder.planner.note(records)
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [2]  # small fed; big's committed chunks wait
    feeder.planner.note([marker(4, "big", 3)])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [0, 1, 2, 3]  # the marker (4) is never moved
    assert feeder.index.low_water() == 5 and not feeder.index.batches


def test_records_after_the_marker_are_fed_at_once() -> None:
    feeder = held_feeder([], Clock())
    feeder.planner.note([sealed(0, "b"), marker(1, "b", 1), sealed(2, "b")])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [0, 2]


def test_a_batch_whose_marker_never_comes_is_abandoned_after_hold_s() -> None:
    clock = Clock()
    feeder = held_feeder([], clock)
    feeder.planner.note([sealed(0, "dead"), sealed(1, "dead"), plain(2, "live")])
    feeder.step(100)
    clock.now += HOLD_S + 1
    feeder.step(100)
    assert sorted(feeder.moved) == [2] and feeder.abandoned == 2
    assert not feeder.index.batches and feeder.index.low_water() == 3


def alive(offset: int, batch: str) -> Message:
    return _record(offset, None, None, list(alive_marker(batch)))


def test_heartbeats_keep_a_slow_publish_held_past_hold_s_and_are_never_moved() -> None:
    clock = Clock()
    feeder = held_feeder([], clock)
    feeder.planner.note([sealed(0, "slow"), plain(1, "live")])
    for n in range(4):  # a heartbeat every half HOLD_S: two HOLD_S in all
        clock.now += HOLD_S / 2
        feeder.planner.note([alive(2 + n, "slow")])
        feeder.step(100)
    assert sorted(feeder.moved) == [1] and feeder.abandoned == 0
    feeder.planner.note([sealed(6, "slow"), marker(7, "slow", 2)])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [0, 1, 6]  # neither heartbeat nor marker moved
    assert not feeder.index.batches and feeder.index.low_water() == 8


def test_a_marker_counting_more_records_than_were_read_abandons_its_batch() -> None:
    feeder = held_feeder([], Clock())
    # record 1 of "gap" never reached the topic (its delivery failed after 2's succeeded)
    feeder.planner.note([sealed(0, "gap"), sealed(2, "gap"), marker(3, "gap", 3), plain(4, "ok")])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [4] and feeder.abandoned == 2
    assert not feeder.index.batches


def test_an_earlier_attempt_s_records_are_fed_with_the_marked_one() -> None:
    feeder = held_feeder([], Clock())
    # the first attempt wrote one record and stopped; the second wrote both and its marker
    feeder.planner.note([sealed(0, "b"), sealed(1, "b"), sealed(2, "b"), marker(3, "b", 2)])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [0, 1, 2]  # readers keep one answer per custom_id


def test_a_takeover_feeds_the_rest_of_a_batch_fed_in_part_at_its_marker() -> None:
    feeder = held_feeder([], Clock())
    feeder.index.fed_to["b"] = 2  # an earlier feeder fed records 0 and 1, then stopped
    feeder.planner.note([sealed(2, "b"), sealed(3, "b"), marker(4, "b", 4)])
    for _ in range(5):
        feeder.step(100)
    assert sorted(feeder.moved) == [2, 3] and feeder.abandoned == 0
