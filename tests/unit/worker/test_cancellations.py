"""Stopped batches: control records, and the worker answering a stopped batch's queued
requests 4005 without running them while the ones on the engine finish."""

from __future__ import annotations

from typing import cast

import pytest

from worker.cancellations import Cancellations, Stop
from worker.errors import ErrorCode

from .fakes import FakeClients, FakeControl, GatedEngine
from .rig import P0, loop_config, rig


def test_stop_records_round_trip_and_bad_ones_are_skipped() -> None:
    stop = Stop("b1", "expired", 12.5)
    assert Stop.decode(stop.encode()) == stop
    assert stop.code == ErrorCode.BATCH_EXPIRED
    for bad in (b"[]", b"{}", b'{"batch_id": "b", "reason": "x", "at": 1}', b"\xff"):
        with pytest.raises(ValueError):
            Stop.decode(bad)
    control = FakeControl()
    control.values.extend([b"junk", stop.encode(), stop.encode()])
    stops = Cancellations(control)
    assert stops.poll() == {"b1": stop}
    assert stops.poll() == {}
    assert stops.stop_for("b1") == stop and stops.stop_for("") is None


def test_a_cancelled_batch_is_answered_4005_except_what_runs() -> None:
    with rig(loop_config(max_batch_size=2), GatedEngine()) as r:
        for i in range(6):
            r.broker.submit(0, f"c{i}", f"hello {i}", batch_id="doomed")
        r.broker.submit(0, "other", "hello other", batch_id="kept")
        r.consumer.rebalance("assign", [P0])
        r.step_until(lambda: len(r.engine.batches) == 1, "a batch on the engine")
        running = set(r.engine.batches[0])
        control = cast(FakeClients, r.worker.clients).fake_control
        control.values.append(Stop("doomed", "cancelled", 1.0).encode())
        r.broker.submit(0, "late", "hello late", batch_id="doomed")
        r.step_until(lambda: len(r.answers()) == 5, "the queued requests answered")
        r.engine.open()
        ids = {f"c{i}" for i in range(6)} | {"other", "late"}
        r.step_until(lambda: r.settled(ids), "everything answered")
        results = {res.custom_id: res for res in r.results()}
        ran = {cid for cid, res in results.items() if res.status == "completed"}
        assert ran == {"other"} | {f"c{i}" for i in range(6) if f"hello {i}" in running}
        assert len(ran) == 3
        cancelled = [res for res in results.values() if res.status == "failed"]
        assert {res.error.code for res in cancelled if res.error} == {ErrorCode.BATCH_CANCELLED}
        assert len(cancelled) == 5 and "late" in {res.custom_id for res in cancelled}
