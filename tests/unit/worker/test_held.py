"""HeldRecords: read order kept, room respected, records of moved partitions let go."""

from __future__ import annotations

from worker.held import HeldRecords

from .fakes import FakeMessage
from .rig import P0, P1


def record(partition: tuple[str, int], offset: int) -> FakeMessage:
    return FakeMessage(partition, offset, None, b"", None)


def test_held_records_come_back_oldest_first_and_moved_partitions_are_let_go() -> None:
    held = HeldRecords()
    held.hold([record(P0, 7), record(P1, 3), record(P0, 8)])
    held.hold([record(P1, 4)])
    assert held.release([P1]) == 2
    assert len(held) == 2
    assert held.take(0) == []
    assert [r.offset() for r in held.take(1)] == [7]
    assert [r.offset() for r in held.take(5)] == [8]
    assert len(held) == 0
