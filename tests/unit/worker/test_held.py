"""HeldRecords: offset order within a partition, read order across them, a newcomer's lower
tag ahead by at most the window, room respected, records of moved partitions let go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from batcher import Partition
from worker.feeder.headers import TAG_HEADER
from worker.kafka.consumer import Record, RecordHeaders
from worker.loop.held import HeldRecords

from .fakes import FakeMessage
from .rig import P0, P1

P2: Partition = ("requests", 2)


def record(
    partition: Partition, offset: int, tag: float | None = None, size: int = 0
) -> FakeMessage:
    headers: RecordHeaders | None = None if tag is None else [(TAG_HEADER, repr(tag).encode())]
    return FakeMessage(partition, offset, None, b"x" * size, headers)


def where(r: Record) -> tuple[Partition, int]:
    topic, partition, offset = r.topic(), r.partition(), r.offset()
    assert topic is not None and partition is not None and offset is not None
    return (topic, partition), offset


def offsets(records: list[Record]) -> list[tuple[int, int]]:
    return [(where(r)[0][1], where(r)[1]) for r in records]


def test_held_records_come_back_in_read_order_and_moved_partitions_are_let_go() -> None:
    held = HeldRecords(window=32)
    held.hold([record(P0, 7, size=3), record(P1, 3, size=5), record(P0, 8, size=1)])
    held.hold([record(P1, 4, size=2)])
    assert held.bytes == 11 and held.count(P1) == 2
    assert held.release([P1]) == 2
    assert len(held) == 2 and held.bytes == 4 and held.count(P1) == 0
    assert held.take(0) == []
    assert [r.offset() for r in held.take(1)] == [7]
    assert [r.offset() for r in held.take(5)] == [8]
    assert len(held) == 0 and held.bytes == 0


def test_a_newcomer_behind_what_was_fetched_is_taken_first() -> None:
    held = HeldRecords(window=32)
    held.hold([record(P0, n, tag=100.0 + n) for n in range(20)])  # a large batch's slices
    held.hold([record(P1, 0, tag=0.0), record(P1, 1, tag=0.0)])  # a newcomer's first slice
    assert offsets(held.take(3)) == [(1, 0), (1, 1), (0, 0)]
    assert offsets(held.take(100)) == [(0, n) for n in range(1, 20)]


def test_a_partition_goes_as_early_as_its_earliest_held_record() -> None:
    """Issue 50: a priority batch's records (tag 0) behind its own record that was read
    when nothing lower was held, and so not moved; the large batch's records read after
    it, moved, went first, and the priority records waited 1.9 s."""
    held = HeldRecords(window=32)
    held.hold([record(P1, 0, tag=1.0)])  # read alone: the highest tag held, not moved
    held.hold([record(P0, n, tag=100.0) for n in range(10)])  # the large batch's
    held.hold([record(P1, 1, tag=0.0), record(P1, 2, tag=0.0)])  # moved: P1 goes with them
    assert offsets(held.take(3)) == [(1, 0), (1, 1), (1, 2)]
    assert offsets(held.take(100)) == [(0, n) for n in range(10)]


def test_a_low_tag_moves_no_further_than_the_window() -> None:
    held = HeldRecords(window=4)
    held.hold([record(P0, n, tag=100.0) for n in range(10)])
    held.hold([record(P1, 0, tag=0.0)])  # read eleventh: goes as if read seventh
    first, then = [(0, n) for n in range(6)], [(0, n) for n in range(6, 10)]
    assert offsets(held.take(11)) == [*first, (1, 0), *then]


def test_offset_order_within_a_partition_holds_whatever_the_tags() -> None:
    held = HeldRecords(window=32)
    held.hold([record(P0, 0, tag=100.0), record(P1, 0, tag=110.0), record(P0, 1, tag=0.0)])
    # P0's newcomer may not pass P0's own earlier record; that one goes by read order
    assert offsets(held.take(3)) == [(0, 0), (0, 1), (1, 0)]


def test_untagged_and_unreadable_tags_keep_read_order() -> None:
    held = HeldRecords(window=32)
    bad = FakeMessage(P1, 0, None, b"", [(TAG_HEADER, b"nan")])
    held.hold([record(P0, 0, tag=100.0), record(P2, 0), bad, record(P0, 1)])
    assert offsets(held.take(4)) == [(0, 0), (2, 0), (1, 0), (0, 1)]


def test_the_ceiling_is_the_highest_tag_still_held() -> None:
    held = HeldRecords(window=32)
    held.hold([record(P2, 0, tag=1e308), record(P0, 0)])  # anyone can write the topic
    assert offsets(held.take(1)) == [(2, 0)]  # gone; an untagged record still held
    held.hold([record(P1, 0, tag=104.0)])  # the large batch's: the highest tag held now
    held.hold([record(P2, 1, tag=0.0)])  # a newcomer
    # ahead of the large batch's record, as if the 1e308 one had never been read (kept
    # as the ceiling, it made the large batch's record a "newcomer" too, moved further)
    assert offsets(held.take(3)) == [(2, 1), (0, 0), (1, 0)]


def test_bytes_count_keys_values_and_headers() -> None:
    held = HeldRecords(window=32)
    held.hold([FakeMessage(P0, 0, b"k" * 7, None, [("h" * 3, b"v" * 5)])])
    held.hold([FakeMessage(P1, 0, None, b"x" * 11, None)])
    assert held.bytes == 7 + 3 + 5 + 11
    held.take(1)
    assert held.bytes == 11


def test_the_tag_ceiling_restarts_once_nothing_is_held() -> None:
    held = HeldRecords(window=32)
    held.hold([record(P0, 0, tag=100.0)])
    held.take(1)
    held.hold([record(P0, 1, tag=50.0), record(P1, 0, tag=60.0)])  # no newcomer: read order
    assert offsets(held.take(2)) == [(0, 1), (1, 0)]


def parts_() -> list[Partition]:
    return [P0, P1, P2]


@settings(max_examples=300, deadline=None)
@given(
    window=st.integers(0, 8),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("hold"), st.integers(0, 2), st.none() | st.floats(0, 200)),
            st.tuples(st.just("take"), st.integers(0, 5), st.none()),
            st.tuples(st.just("release"), st.integers(0, 2), st.none()),
        ),
        max_size=80,
    ),
)
def test_order_and_bound_hold_under_any_mix(
    window: int, steps: list[tuple[str, int, float | None]]
) -> None:
    """Every partition's records come out in offset order; a record is never taken after
    one read more than ``window`` after it; the counts add up; and each take is the one a
    plain model makes (the partition of the lowest place held: a partition goes as early
    as its earliest record; a tag below the highest held moves a record ``window`` places,
    and a half, ahead)."""
    held = HeldRecords(window)
    model: dict[Partition, list[tuple[float, float | None]]] = {p: [] for p in parts_()}
    parts = parts_()
    next_offset = {p: 0 for p in parts}
    read_seq: dict[tuple[Partition, int], int] = {}
    inside: set[tuple[Partition, int]] = set()
    last_taken = {p: -1 for p in parts}
    seq = 0
    for kind, n, tag in steps:
        if kind == "hold":
            p = parts[n]
            ceiling = max((t for q in model.values() for _, t in q if t is not None), default=None)
            moved = tag is not None and ceiling is not None and tag < ceiling
            model[p].append((seq - window - 0.5 if moved else seq, tag))
            held.hold([record(p, next_offset[p], tag)])
            read_seq[(p, next_offset[p])] = seq
            inside.add((p, next_offset[p]))
            next_offset[p] += 1
            seq += 1
        elif kind == "take":
            taken = held.take(n)
            assert len(taken) == min(n, len(inside))
            for r in taken:
                first = min((min(x[0] for x in q), p) for p, q in model.items() if q)[1]
                assert where(r)[0] == first
                model[first].pop(0)
                key = where(r)
                p, offset = key
                assert offset > last_taken[p]
                last_taken[p] = offset
                inside.remove(key)
                # nothing still held was read more than ``window`` before it
                assert all(read_seq[k] >= read_seq[key] - window for k in inside)
        else:
            p = parts[n]
            mine = {k for k in inside if k[0] == p}
            assert held.release([p]) == len(mine)
            model[p].clear()
            inside -= mine
            last_taken[p] = next_offset[p] - 1
        assert len(held) == len(inside)
        assert all(held.count(p) == sum(k[0] == p for k in inside) for p in parts)
