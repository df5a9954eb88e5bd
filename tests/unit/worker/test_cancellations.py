"""Stopped batches: control records, and the worker answering a stopped batch's queued
requests 4005 without running them; on a static engine the running batch finishes, an
in-flight engine aborts the running ones."""

from __future__ import annotations

from typing import cast

import pytest

from worker.errors import ErrorCode
from worker.kafka.cancellations import Cancellations, Stop

from .fakes import FakeClients, FakeControl, GatedEngine, GatedInFlightEngine
from .rig import P0, loop_config, rig


def test_stop_records_round_trip_and_bad_ones_are_skipped() -> None:
    stop = Stop("b1", "expired", 12.5)
    assert Stop.decode(stop.encode()) == stop
    assert stop.code == ErrorCode.BATCH_EXPIRED
    nested = b"[" * 50_000  # past the parser's recursion limit
    for bad in (b"[]", b"{}", b'{"batch_id": "b", "reason": "x", "at": 1}', b"\xff", nested):
        with pytest.raises(ValueError):
            Stop.decode(bad)
    control = FakeControl()
    control.values.extend([b"junk", nested, stop.encode(), stop.encode()])
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


def test_an_in_flight_engine_aborts_a_cancelled_batch_and_keeps_what_finished() -> None:
    with rig(loop_config(max_batch_size=3), GatedInFlightEngine(late_aborts=True)) as r:
        for i in range(5):
            r.broker.submit(0, f"c{i}", f"hello {i}", batch_id="doomed")
        r.broker.submit(0, "other", "hello other", batch_id="kept")
        r.consumer.rebalance("assign", [P0])
        r.step_until(lambda: len(r.engine.running) == 3, "three requests in flight")
        on_engine = list(r.engine.running)
        control = cast(FakeClients, r.worker.clients).fake_control
        control.values.append(Stop("doomed", "cancelled", 1.0).encode())
        r.step_until(lambda: len(r.answers()) == 5, "the doomed requests answered")
        # every doomed request on the engine (offsets 0-4; "other" is offset 5) was aborted
        doomed = [k for k in on_engine if int(k.split("/")[2].split("#")[0]) < 5]
        assert sorted(r.engine.aborted) == sorted(doomed)
        assert r.engine.aborted
        r.engine.open()  # late completions of aborted keys must not be answered again
        ids = {f"c{i}" for i in range(5)} | {"other"}
        r.step_until(lambda: r.settled(ids), "everything answered")
        assert set(r.answers().values()) == {1}
        results = {res.custom_id: res for res in r.results()}
        assert results["other"].status == "completed"
        errors = [results[f"c{i}"].error for i in range(5)]
        assert {e.code for e in errors if e is not None} == {ErrorCode.BATCH_CANCELLED}
        assert all(results[f"c{i}"].status == "failed" for i in range(5))
