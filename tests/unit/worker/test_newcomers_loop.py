"""Newcomers first in the worker loop: a request fed later with a lower virtual tag
(``batchpipe-tag``, written by the feeder, docs/architecture.md §10) runs before the
requests the worker already holds with higher tags; a tag that is not a number leaves its
request in arrival order, answered like any other. A full worker reads one engine batch
ahead, so a newcomer fed while a slow batch runs is admitted before the next batch forms
(§2 "Backpressure")."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

import worker.loop.engine_stage
import worker.loop.runner
import worker.loop.service
from worker.engines.base import EngineInput, OnComplete
from worker.feeder.headers import TAG_HEADER
from worker.wire.codec import encode_request
from worker.wire.messages import InferenceRequest

from .fakes import GatedEngine
from .rig import P0, P1, WAIT_S, Rig, loop_config, rig


def feed(r: Rig[Any], custom_id: str, tag: bytes | None) -> None:
    value, headers = encode_request(InferenceRequest(custom_id=custom_id, prompt=custom_id))
    r.broker.append(0, value, [*headers, *([] if tag is None else [(TAG_HEADER, tag)])])


@pytest.mark.parametrize(
    ("tag", "runs_next"),
    [(b"0", True), (b"12.5", True), (b"nan", False), (b"-1", False), (b"9" * 400, False)],
)
def test_a_later_lower_tag_runs_before_the_held_higher_tags(tag: bytes, runs_next: bool) -> None:
    held = [f"large{n}" for n in range(12)]
    with rig(loop_config(prefetch_count=16, max_batch_size=4), GatedEngine()) as r:
        for n, custom_id in enumerate(held):
            feed(r, custom_id, str(100 + 10 * (n // 4)).encode())  # three slices
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "the first batch on the engine")
        r.step_until(lambda: len(r.worker.batcher) == 8, "the other eight held")
        feed(r, "small", tag)
        r.step_until(lambda: len(r.worker.batcher) == 9, "the newcomer admitted")
        r.engine.open()
        r.step_until(lambda: r.settled({*held, "small"}), "every request answered")
        batches = r.engine.batches
        assert batches[0] == tuple(held[:4])
        if runs_next:
            assert batches[1][0] == "small"  # ahead of the eight held before it
        else:
            assert batches[-1][-1] == "small"  # no tag: arrival order, last
        assert sorted(r.answers().values()) == [1] * 13


class Clock:
    """A fake ``time`` for the loop, its stage and its engine thread: ``monotonic`` moves
    only when the test says; ``sleep`` yields for real (other threads run) without moving
    it; the rest is the real module's."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.001))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class OneByOne(GatedEngine):
    """Each batch runs when the test releases it."""

    def __init__(self) -> None:
        super().__init__(gated=False)
        self._turns = threading.Semaphore(0)

    def release(self) -> None:
        self._turns.release()

    def open(self) -> None:
        self._turns.release(1000)

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        with self._lock:
            self._batches.append(tuple(bytes(i.prompt_token_ids).decode() for i in inputs))
        assert self._turns.acquire(timeout=WAIT_S), "the test never released the batch"
        self._echo.run_batch(inputs, on_complete)


def fake_time(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    for module in (worker.loop.service, worker.loop.engine_stage, worker.loop.runner):
        monkeypatch.setattr(module, "time", clock)
    return clock


def trace_steps(monkeypatch: pytest.MonkeyPatch, r: Rig[Any]) -> list[str]:
    """From now on, "step" for each loop step, "collected" when one ends an engine batch
    and "dispatched" when one starts the next, in order."""
    stage, loop = r.worker.engine_stage, r.worker
    events: list[str] = []
    collect, dispatch, step = stage.collect, stage.dispatch, loop._step

    def collecting() -> None:
        busy = stage.busy
        collect()
        if busy and not stage.busy:
            events.append("collected")

    def dispatching(now: float, flush: bool) -> None:
        busy = stage.busy
        dispatch(now, flush)
        if stage.busy and not busy:
            events.append("dispatched")

    def stepping(draining: bool) -> None:
        events.append("step")
        step(draining)

    monkeypatch.setattr(stage, "collect", collecting)
    monkeypatch.setattr(stage, "dispatch", dispatching)
    monkeypatch.setattr(loop, "_step", stepping)
    return events


def test_a_newcomer_fed_while_a_slow_batch_runs_starts_in_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Full (4 running, 4 queued) and past the pause delay, the worker reads on and holds
    the newcomer fed meanwhile without admitting it; when the 4 s batch ends, it is
    admitted before the next batch forms and heads it, ahead of the four queued — in the
    step that collected the batch, so the engine waits for no read."""
    clock = fake_time(monkeypatch)
    engine = OneByOne()
    large = [f"large{n}" for n in range(8)]
    with rig(loop_config(prefetch_count=8, max_batch_size=4), engine) as r:
        for n, custom_id in enumerate(large):
            feed(r, custom_id, str(100 + 10 * (n // 4)).encode())
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(engine.batches) == 1 and len(r.worker.batcher) == 4, "full")
        clock.now += 0.6  # full for longer than _PAUSE_AFTER_S, holding nothing ahead
        feed(r, "small", b"0")
        r.step_until(lambda: r.consumer.delivered == 9, "the newcomer read while full")
        assert r.consumer.paused() == set()  # less than an engine batch held: reading on
        assert len(r.worker.ledger) == 8  # held, not admitted: prefetch_count holds
        clock.now += 3.4  # the first batch took 4 s
        events = trace_steps(monkeypatch, r)
        engine.release()
        r.step_until(lambda: len(engine.batches) == 2, "the second batch on the engine")
        assert engine.batches[1][0] == "small"  # not one batch later, behind large4-7
        collected = events.index("collected")  # formed in that step: no wait for a read
        assert events[collected + 1] == "dispatched"
        assert r.worker.admission.peak == 8
        engine.open()
        r.step_until(lambda: r.settled({*large, "small"}), "every request answered")
        assert sorted(r.answers().values()) == [1] * 9


def test_a_full_worker_holds_one_engine_batch_ahead_then_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = fake_time(monkeypatch)
    engine = OneByOne()
    ids = [f"r{n}" for n in range(20)]
    with rig(loop_config(prefetch_count=8, max_batch_size=4), engine) as r:
        for custom_id in ids:
            feed(r, custom_id, None)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.consumer.delivered == 12, "8 admitted and 4 read ahead")
        assert r.consumer.paused() == set()  # full only a moment: no pause yet
        clock.now += 0.6
        r.step_until(lambda: r.consumer.paused() == {P0, P1}, "paused, one batch held")
        for _ in range(20):
            r.worker._step(draining=False)
        assert r.consumer.delivered == 12 and len(r.worker.ledger) == 8
        engine.open()
        r.step_until(lambda: r.settled(set(ids)), "every request answered")
        assert r.worker.admission.peak == 8
        assert sorted(r.answers().values()) == [1] * 20


def test_records_read_ahead_of_a_partition_revoked_meanwhile_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A revoke served by the read that precedes admitting the held records lets go of that
    partition's held records first: none is admitted for a partition no longer owned (the
    new owner answers them), and once it is assigned back every request is answered once
    (taken before the read, they were admitted anyway: answered twice, and the tracker
    refused the offsets read again)."""
    fake_time(monkeypatch)
    engine = OneByOne()
    ids = [f"r{n}" for n in range(16)]
    with rig(loop_config(prefetch_count=8, max_batch_size=4), engine) as r:
        for custom_id in ids:
            feed(r, custom_id, None)
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.worker._held) == 4, "full, one engine batch held ahead")
        engine.release()
        r.step_until(lambda: r.worker.admission.room > 0, "a batch's slots free")
        r.consumer.rebalance("revoke", [P0])
        r.worker._step(draining=False)
        assert r.worker.ledger.tracker.pending(P0) == 0
        assert len(r.worker._held) == 0
        r.consumer.rebalance("assign", [P0, P1])
        engine.open()
        r.step_until(lambda: r.settled(set(ids)), "every request answered")
        assert sorted(r.answers().values()) == [1] * 16


@pytest.mark.parametrize("fair", [True, False])
def test_a_newcomer_fetched_behind_a_deep_read_runs_next_where_the_feeder_tags(
    fair: bool,
) -> None:
    """With ``scheduling.fair`` the worker reads what is fetched already past one engine
    batch, so a newcomer's first slice, on a partition of its own behind 30 records read
    before it, is admitted when the first batch frees slots and heads the batch formed after
    it (a short batch: the next one starts at once from the queue, §2). Without, the worker
    reads one engine batch ahead, and the newcomer only after the other 30."""
    config = loop_config(prefetch_count=8, max_batch_size=4)
    config = replace(config, scheduling=replace(config.scheduling, fair=fair))
    large = [f"large{n}" for n in range(30)]
    with rig(config, OneByOne()) as r:
        for n, custom_id in enumerate(large):
            feed(r, custom_id, str(100 + 10 * (n // 4)).encode())
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "the first batch on the engine")
        value, headers = encode_request(InferenceRequest(custom_id="small", prompt="small"))
        r.broker.append(1, value, [*headers, (TAG_HEADER, b"0")])
        r.step_until(lambda: r.consumer.delivered >= 12, "full, and reading ahead")
        for _ in range(5):
            r.worker._step(draining=False)
        r.engine.open()
        r.step_until(lambda: r.settled({*large, "small"}), "every request answered")
        batches = r.engine.batches
        assert batches[0] == tuple(large[:4])
        if fair:  # admitted as the first batch ends: in the batch formed after that
            assert batches[2][0] == "small"
        else:
            assert "small" in batches[-2] + batches[-1]  # read after the other 30
        assert sorted(r.answers().values()) == [1] * 31


@pytest.mark.parametrize(("value_bytes", "most_held"), [(10, 64), (1 << 20, 20)])
def test_the_deep_read_stops_at_its_count_and_its_bytes(value_bytes: int, most_held: int) -> None:
    """Full with fair share on, the worker holds at most 8 records a slot (64 here) and,
    with 1 MiB records (a header here), stops reading once the held ones reach 16 MiB (one
    engine batch past it at most); the rest stay in the topic; every record answered once."""
    config = loop_config(prefetch_count=8, max_batch_size=4)
    config = replace(config, scheduling=replace(config.scheduling, fair=True))
    ids = [f"r{n}" for n in range(100)]
    with rig(config, OneByOne()) as r:
        for custom_id in ids:
            value, headers = encode_request(InferenceRequest(custom_id=custom_id, prompt=custom_id))
            r.broker.append(0, value, [*headers, ("pad", b"x" * value_bytes)])
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "the first batch on the engine")
        for _ in range(5):
            r.worker._step(draining=False)
        held = len(r.worker._held)
        assert most_held - 4 <= held <= most_held
        assert r.consumer.delivered == 8 + held  # the rest is left in the topic
        r.engine.open()
        r.step_until(lambda: r.settled(set(ids)), "every request answered")
        assert sorted(r.answers().values()) == [1] * 100
