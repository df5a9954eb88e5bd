"""The scan's hole guard (worker/feeder/gaps.py): a record the broker shows after one it
has not shown yet is read again, never passed over; a hole read twice is the partition's."""

from __future__ import annotations

from typing import cast

from confluent_kafka import Message

from tests.unit.worker.fakes import FakeMessage
from worker.feeder.gaps import GapGuard


def at(*offsets: int) -> list[Message]:
    return [cast(Message, FakeMessage(("p", 0), o, None, b"v", None)) for o in offsets]


def offsets(records: list[Message]) -> list[int | None]:
    return [m.offset() for m in records]


def test_consecutive_offsets_pass_and_a_hole_is_read_again_from_its_start() -> None:
    guard = GapGuard()
    guard.reset(10)
    passed, again = guard.admit(at(10, 11, 13, 14))
    assert offsets(passed) == [10, 11] and again == 12  # 13 and 14 wait for the re-read
    passed, again = guard.admit(at(12, 13, 14))  # the broker stored 12 meanwhile
    assert offsets(passed) == [12, 13, 14] and again is None


def test_a_hole_found_again_at_the_same_place_is_the_partitions_own() -> None:
    guard = GapGuard()
    guard.reset(0)
    assert offsets(guard.admit(at(0, 1, 3))[0]) == [0, 1]
    passed, again = guard.admit(at(3, 4))  # read again: still no 2 (a control record)
    assert offsets(passed) == [3, 4] and again is None
    # a later hole elsewhere is read again once more
    passed, again = guard.admit(at(7))
    assert passed == [] and again == 5


def test_records_read_again_after_a_seek_are_handed_on_once() -> None:
    guard = GapGuard()
    guard.reset(0)
    guard.admit(at(0, 1, 2, 4))
    passed, _ = guard.admit(at(0, 1, 2, 3, 4))  # the seek went back further than needed
    assert offsets(passed) == [3, 4]


def test_a_new_assignment_drops_what_the_old_one_read_below_its_start() -> None:
    guard = GapGuard()
    guard.reset(0)
    guard.admit(at(0, 1, 2))
    guard.reset(1)  # the new owner scans from 1: 1 and 2 again, and nothing below
    passed, again = guard.admit(at(0, 1, 2, 3))
    assert offsets(passed) == [1, 2, 3] and again is None
    # records of the old assignment above the new start: read again from the start
    guard.reset(5)
    passed, again = guard.admit(at(8, 9))
    assert passed == [] and again == 5


def test_a_scan_from_the_beginning_starts_at_the_first_record_read() -> None:
    guard = GapGuard()
    guard.reset(-2)  # OFFSET_BEGINNING: the partition's first record may be above 0
    passed, again = guard.admit(at(40, 41))
    assert offsets(passed) == [40, 41] and again is None
