"""Batches published without fair share: requests held until their batch's seal on the
control topic, given up whole (4009) on ``void`` or without a sign (docs/architecture.md §7
"Publish without transactions, without fair share")."""

from __future__ import annotations

from typing import cast

import pytest

from batcher import Pending
from worker.errors import ErrorCode
from worker.kafka.cancellations import Cancellations, Stop
from worker.kafka.seals import SEAL_HEADER, SEAL_VALUE, Seal, sealed_by_control
from worker.loop.gate import Gate
from worker.loop.jobs import Job
from worker.wire.codec import encode_request
from worker.wire.messages import InferenceRequest

from .fakes import FakeClients, FakeControl, GatedEngine
from .rig import P0, P1, Rig, loop_config, rig


def _pending(batch_id: str, offset: int, partition: int = 0) -> Pending[Job]:
    """A stand-in for a decoded request: the gate reads its batch id and partition only."""
    request = InferenceRequest(custom_id=f"{batch_id}-{offset}", prompt="x", batch_id=batch_id)

    class _Job:
        def __init__(self) -> None:
            self.request = request

    return Pending(
        key=f"t/{partition}/{offset}",
        partition=("t", partition),
        offset=offset,
        prompt_tokens=1,
        max_tokens=1,
        arrival=0.0,
        payload=cast(Job, _Job()),
    )


def _ids(items: list[Pending[Job]]) -> list[str]:
    return [p.payload.request.custom_id for p in items]


def test_seals_round_trip_and_anything_else_is_refused() -> None:
    seal = Seal("b1", "sealed", 12.5, 3)
    assert Seal.decode(seal.encode()) == seal and seal.key == b"seal:b1"
    nested = b"[" * 50_000
    for bad in (
        b"[]",
        b'{"seal": "done", "batch_id": "b", "at": 1}',
        b'{"seal": "open", "batch_id": "", "at": 1}',
        b'{"seal": "open", "batch_id": "b", "at": true}',
        b'{"seal": "sealed", "batch_id": "b", "at": 1, "count": -1}',
        b'{"seal": "open", "batch_id": "' + b"b" * 300 + b'", "at": 1}',
        nested,
    ):
        with pytest.raises(ValueError):
            Seal.decode(bad)
    assert sealed_by_control([(SEAL_HEADER, SEAL_VALUE)])
    assert sealed_by_control({SEAL_HEADER: "control"})
    assert not sealed_by_control([(SEAL_HEADER, b"other")]) and not sealed_by_control(None)


def test_the_control_topic_hands_seals_over_and_stops_stay_stops() -> None:
    control, seen = FakeControl(), list[Seal]()
    stop = Stop("b2", "cancelled", 1.0)
    seal = Seal("b1", "open", 1.0)
    control.values.extend([seal.encode(), b'{"seal": "bogus"}', stop.encode()])
    stops = Cancellations(control, seen.append)
    assert stops.poll() == {"b2": stop} and seen == [seal]
    control.values.append(seal.encode())
    assert Cancellations(control).poll() == {}  # the feeder's reader: seals are not stops


def test_held_until_sealed_then_released_in_read_order() -> None:
    gate = Gate(give_up_s=30.0)
    gate.see(Seal("b", "open", 0.0), now=0.0)
    for offset in range(3):
        assert gate.verdict("b") == "hold"
        gate.hold(_pending("b", offset), now=1.0)
    assert gate.step(2.0) == ([], []) and len(gate) == 3
    gate.see(Seal("b", "sealed", 0.0, 3), now=3.0)
    released, given_up = gate.step(3.0)
    assert _ids(released) == ["b-0", "b-1", "b-2"] and given_up == [] and len(gate) == 0
    assert gate.verdict("b") == "pass"
    gate.see(Seal("b", "void", 0.0), now=4.0)  # the first end read is the batch's
    assert gate.verdict("b") == "pass"


def test_void_or_silence_gives_the_whole_batch_up_and_its_later_requests_too() -> None:
    gate = Gate(give_up_s=30.0)
    gate.hold(_pending("v", 0), now=0.0)
    gate.see(Seal("v", "void", 0.0), now=1.0)
    released, given_up = gate.step(1.0)
    assert released == [] and _ids(given_up) == ["v-0"] and gate.verdict("v") == "void"
    assert gate.step(2.0) == ([], [])  # handed over once
    # silence: signs keep a batch waiting; GIVE_UP_S after the newest one it is given up
    gate.hold(_pending("s", 0), now=0.0)
    gate.see(Seal("s", "open", 0.0), now=20.0)
    assert gate.step(45.0) == ([], [])
    released, given_up = gate.step(50.5)
    assert released == [] and _ids(given_up) == ["s-0"] and gate.verdict("s") == "void"
    # a batch only signed here (its requests on another worker's partitions) is given up
    # too, so that its requests read after a rebalance are not waited for again
    gate.see(Seal("elsewhere", "open", 0.0), now=0.0)
    assert gate.step(31.0) == ([], []) and gate.verdict("elsewhere") == "void"


def test_a_partition_let_go_takes_its_held_requests_with_it() -> None:
    gate = Gate()
    gate.hold(_pending("b", 0, partition=0), now=0.0)
    gate.hold(_pending("b", 0, partition=1), now=0.0)
    gate.drop([("t", 0)])
    gate.see(Seal("b", "sealed", 0.0, 2), now=1.0)
    released, _ = gate.step(1.0)
    assert [p.partition for p in released] == [("t", 1)]


def _submit(r: Rig[GatedEngine], partition: int, custom_id: str, batch_id: str) -> None:
    request = InferenceRequest(custom_id=custom_id, prompt=f"hello {custom_id}", batch_id=batch_id)
    value, headers = encode_request(request)
    r.broker.append(partition, value, [*headers, (SEAL_HEADER, SEAL_VALUE)])


def test_the_worker_runs_a_sealed_batch_and_answers_a_void_one_4009_unrun() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        control = cast(FakeClients, r.worker.clients).fake_control
        for i in range(4):
            _submit(r, i % 2, f"w{i}", "whole")
            _submit(r, i % 2, f"k{i}", "killed")
        r.broker.submit(0, "plain", "hello plain", batch_id="other")  # no seal header
        control.values.append(Seal("whole", "open", 1.0).encode())
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: "plain" in r.answers(), "the request without a seal header")
        for _ in range(20):  # held: nothing of either sealed batch runs or is answered
            r.worker._step(draining=False)
        assert set(r.answers()) == {"plain"} and r.engine.batches == [("hello plain",)]
        control.values.append(Seal("whole", "sealed", 2.0, 4).encode())
        control.values.append(Seal("killed", "void", 2.0).encode())
        everything = {f"w{i}" for i in range(4)} | {f"k{i}" for i in range(4)} | {"plain"}
        r.step_until(lambda: r.settled(everything), "both batches answered and committed")
        results = {res.custom_id: res for res in r.results()}
        assert all(results[f"w{i}"].status == "completed" for i in range(4))
        errors = [results[f"k{i}"].error for i in range(4)]
        assert {e.code for e in errors if e} == {ErrorCode.PUBLISH_INCOMPLETE}
        ran = {p for batch in r.engine.batches for p in batch}
        assert not any(p.startswith("hello k") for p in ran)
        assert set(r.answers().values()) == {1}
