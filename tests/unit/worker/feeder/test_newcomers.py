"""Newcomers first, the feeder's side (docs/architecture.md §10): a newly active batch's
first slice is fed beyond the workers' credit (by up to one batch), batches that become
active together share one engine batch for their first slices and are written a request
of each in turn, and every shared record carries its key's virtual tag in
``batchpipe-tag``, lowest for a newcomer, read back by the worker with a bound (anyone
can write the requests topic)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batcher import BatchLimits, DynamicBatcher, Pending
from batcher.fairshare import FairShare
from tests.unit.worker.feeder.test_quarantine import Feeder, Producer, record
from worker.feeder.credits import Credits
from worker.feeder.demand import Demand
from worker.feeder.forward import forward
from worker.feeder.headers import MAX_NUMBER_CHARS, TAG_HEADER, tag_of, with_tag
from worker.feeder.plan import Step, in_tag_order


def test_a_newly_active_batch_is_served_beyond_the_room_once() -> None:
    fair = FairShare(4)
    fair.add("large", 100, key="alice")
    assert fair.next(4) == ("large", 4) and (fair.tag, fair.tag_step) == (0.0, 1.0)
    assert fair.next(4) == ("large", 4) and fair.tag == 4.0
    assert fair.next(0, fresh=8) is None  # served before: no overdraw
    fair.add("small", 3, key="bob")
    assert fair.next(0, fresh=8) == ("small", 3)
    assert fair.tag == 0.0  # bob's first slice: no service yet
    assert fair.next(0, fresh=8) is None


def test_a_key_tag_is_its_service_since_it_became_active() -> None:
    fair = FairShare(2)
    fair.add("a", 10, key="alice", tokens=5.0)
    tags = []
    for _ in range(3):
        assert fair.next(2) is not None
        tags.append(fair.tag)
    assert tags == [0.0, 10.0, 20.0]  # 2 requests × 5 tokens a slice, weight 1
    fair.add("b", 4, key="bob", tokens=5.0)
    assert fair.next(2) == ("b", 2) and fair.tag == 0.0  # bob has been served nothing


def test_the_planner_feeds_a_newcomer_when_the_credit_is_spent() -> None:
    feeder = Feeder([*(record(o, "large") for o in range(40)), record(40, "small")])
    feeder.planner.note(feeder.log.records[:40])
    first = feeder.planner.plan(8, 16, fresh=64)
    assert [b for b, _ in first.slices] == ["large", "large"] and first.shared == 8
    assert feeder.planner.plan(0, 16, fresh=64).slices == []  # no credit, nothing new
    feeder.planner.note(feeder.log.records[40:])
    step = feeder.planner.plan(0, 16, fresh=64)
    assert [(b, len(r)) for b, r in step.slices] == [("small", 1)]
    assert step.tags == [(0.0, 9.0)]  # bob: no service yet; 9 tokens a request
    assert first.tags == [(0.0, 9.0), (36.0, 9.0)]
    assert feeder.planner.plan(0, 16, fresh=64).slices == []


def test_the_tag_goes_on_every_shared_record_replacing_a_publishers() -> None:
    m = record(0, "a", batchpipe_tag=b"0")  # a publisher's own: not the feeder's
    producer = Producer()
    assert forward(producer, "requests", "dead", m, lambda *_: None, 3, 12.5)
    headers = producer.sent[0][2]
    assert [v for n, v in headers if n == TAG_HEADER] == [b"12.5"]
    assert tag_of(headers) == 12.5


def test_a_record_fed_beyond_credit_goes_to_the_live_workers() -> None:
    credits = Credits(4, clock=lambda: 1.0, wall=lambda: 1.0)
    credits.report(Demand("w0", 1.0, ((0, 0),), held=4, running=4, free=0))
    credits.report(Demand("w1", 1.0, ((1, 0),), held=4, running=4, free=0))
    for offset in range(4):  # one batch each, unread: no credit left
        credits.delivered(0, offset)
        credits.delivered(1, offset)
    assert credits.room() == 0 and credits.place(5) == []
    assert credits.place(5, over=3) == [0, 1, 0]  # in turn, as far as ``over`` allows
    assert credits.live()
    empty = Credits(4, clock=lambda: 1.0, wall=lambda: 1.0)
    assert not empty.live() and empty.place(5, over=5) == []


@pytest.mark.parametrize(
    "raw",
    [
        b"nan",
        b"NaN",
        b"inf",
        b"-inf",
        b"1e400",  # inf once read
        b"-1",
        b"",
        b"x",
        b"\xff\xfe",
        "\udcff",
        b"1" * (MAX_NUMBER_CHARS + 1),
        b"0x10",
        None,
    ],
)
def test_a_bad_tag_is_no_tag(raw: Any) -> None:
    assert tag_of([(TAG_HEADER, raw)]) is None


def test_tags_read_back() -> None:
    assert tag_of([(TAG_HEADER, b"0")]) == 0.0
    assert tag_of({TAG_HEADER: "3.25"}) == 3.25
    assert tag_of([(TAG_HEADER, b"9"), (TAG_HEADER, b"1")]) == 1.0  # the last one
    assert tag_of(None) is None and tag_of([]) is None
    assert tag_of(with_tag({"a": b"1"}, 1e12 / 3)) == 1e12 / 3


@given(
    st.lists(
        st.tuples(
            st.sampled_from([TAG_HEADER, "other"]),
            st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40)),
        ),
        max_size=6,
    )
)
def test_any_header_reads_as_a_finite_tag_or_none(headers: list[tuple[str, Any]]) -> None:
    tag = tag_of(headers)
    assert tag is None or (math.isfinite(tag) and tag >= 0)


def test_four_batches_fed_at_once_are_started_request_by_request_in_turn() -> None:
    """Four new batches' first slices go out together (each beyond credit) with equal
    slice tags; each request carries its own (the slice's + its place × its cost), so a
    worker starts them in turn, not one batch after the other (bench.fairness at 1 s a
    step: Jain's index of four batches 0.25 with one tag a slice)."""
    records = [record(10 * k + o, f"c{k}") for k in range(4) for o in range(4)]
    feeder = Feeder(records)
    feeder.planner.note(records)
    step = feeder.planner.plan(0, 64, fresh=64)
    assert [(b, len(r)) for b, r in step.slices] == [(f"c{k}", 4) for k in range(4)]
    worker: DynamicBatcher[None] = DynamicBatcher(BatchLimits(max_batch_size=4))
    for (batch_id, slice_), (start, per) in zip(step.slices, step.tags, strict=True):
        for n in range(len(slice_)):
            tag = start + n * per
            worker.add(Pending(f"{batch_id}.{n}", ("r", 0), 0, 1, 1, 0.0, None, tag=tag), 0.0)
    assert [p.key for p in worker.queued()[:8]] == [
        *(f"c{k}.0" for k in range(4)),
        *(f"c{k}.1" for k in range(4)),
    ]


def test_batches_never_served_share_one_engine_batch_for_their_first_slices() -> None:
    fair = FairShare(64)
    assert fair.first_slice(32) == 32  # none waiting: a whole engine batch
    for k in range(4):
        fair.add(f"c{k}", 80, key=f"c{k}")
    assert fair.newcomers == 4 and fair.first_slice(32) == 8
    assert fair.next(0, fresh=64, first=8) == ("c0", 8)  # beyond the room, capped
    assert fair.newcomers == 3
    assert fair.next(64, first=8) == ("c1", 8)  # within the room too
    fair.remove("c2")  # cancelled before it was served
    assert fair.newcomers == 1 and fair.first_slice(32) == 32
    assert fair.next(64, first=8) == ("c3", 8)
    assert fair.newcomers == 0
    assert fair.next(64, first=8) == ("c0", 64)  # served: whole slices from now on
    fair.add("many", 5, key="many")
    assert fair.first_slice(0) == 1  # never less than one request


def test_a_steps_shared_records_are_written_lowest_tag_first() -> None:
    """Four batches that became active together: their first slices (a share of one
    engine batch each, 8 // 4) go out a request of each in turn, not slice after slice
    (a worker reads its partition in order and reorders only what it holds)."""
    records = [record(100 * k + o, f"c{k}") for k in range(4) for o in range(40)]
    feeder = Feeder(records, engine=8)
    feeder.planner.note(records)
    step = feeder.planner.plan(0, 64, fresh=64)
    assert [(b, len(r)) for b, r in step.slices] == [(f"c{k}", 2) for k in range(4)]
    written = [(m.offset(), tag) for m, tag, _, _ in step.written([], 0, 0)]
    assert written == [
        *((100 * k, 0.0) for k in range(4)),
        *((100 * k + 1, 9.0) for k in range(4)),
    ]
    later = feeder.planner.plan(16, 64)  # served: whole slices (a quantum, 4), in tag order
    assert [len(r) for _, r in later.slices] == [4, 4, 4, 4]
    assert [m.offset() for m, *_ in later.written([], 0, 0)][:4] == [2, 102, 202, 302]


def test_the_records_fed_beyond_credit_keep_their_label_when_written_first() -> None:
    """Review s5 #1: a step with a served batch's slice within the room and a newcomer's
    first slice beyond it (tag 0, so written first). The newcomer's records take the
    places beyond credit and count as overdraft; the served batch's take the credit's,
    whatever the write order (the overdraft comes back as the worker reads *them*)."""
    old = [record(o, "old") for o in range(4)]
    new = [record(100 + o, "new") for o in range(2)]
    step = Step(slices=[("old", old), ("new", new)], tags=[(50.0, 1.0), (0.0, 1.0)], shared=6)
    placed = [3, 3, 3, 3, 5, 5]  # Credits.place: four within credit, then two beyond
    written = [(m.offset(), p, over) for m, _, p, over in step.written(placed, 2, 2)]
    assert written == [
        (100, 5, True),  # the newcomer first (lowest tags), on the places beyond credit
        (101, 5, True),
        (0, 3, False),
        (1, 3, False),
        (2, 3, False),
        (3, 3, False),
    ]
    # credit ran short: one place within, none beyond; the rest are written unplaced
    short = [(m.offset(), p, over) for m, _, p, over in step.written([3], 0, 2)]
    assert short == [(100, None, False), (101, None, False), (0, 3, False)] + [
        (o, None, False) for o in (1, 2, 3)
    ]


def test_in_tag_order_is_stable_and_keeps_each_slices_order() -> None:
    slices = [((0.0, 2.0), ["a0", "a1", "a2"]), ((1.0, 2.0), ["b0", "b1"]), ((0.0, 2.0), ["c0"])]
    assert in_tag_order(slices) == [
        ("a0", 0.0),
        ("c0", 0.0),
        ("b0", 1.0),
        ("a1", 2.0),
        ("b1", 3.0),
        ("a2", 4.0),
    ]
    assert in_tag_order([]) == []
