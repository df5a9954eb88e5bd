"""Light load (issue 29): a lone request leaves the batcher at ``timeout_ms``, its answer is
committed as soon as the worker is idle, and nothing the loop does waits on the broker's
offset queries (the lag is measured on a thread of its own)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from worker.config import Config
from worker.obs.lag import LagProbe

from .fakes import GatedEngine
from .rig import P0, P1, WAIT_S, Rig, loop_config, rig

STEP_S = 0.005  # how far the fake clock moves per loop step


class FakeClock:
    """``time.monotonic`` for the worker loop: moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr("worker.loop.service.time.monotonic", fake)
    yield fake


def timeout_config(commit_interval_ms: int) -> Config:
    config = loop_config(max_batch_size=8, commit_interval_ms=commit_interval_ms)
    return replace(config, batching=replace(config.batching, timeout_ms=100))


def step_clock(r: Rig, clock: FakeClock, until: float) -> None:
    """Step the loop, moving the fake clock :data:`STEP_S` a step, up to ``until``."""
    while clock.now < until:
        clock.now += STEP_S
        r.worker._step(draining=False)


@pytest.mark.parametrize("commit_interval_ms", [0, 3_600_000])
def test_a_lone_request_leaves_the_batcher_at_timeout_ms_whatever_the_commits_do(
    clock: FakeClock, commit_interval_ms: int
) -> None:
    # commits on every step (0), or never by the timer: the release does not depend on it
    config = timeout_config(commit_interval_ms)
    with rig(config, GatedEngine(gated=False), delivery="exactly_once") as r:
        r.consumer.rebalance("assign", [P0, P1])
        r.broker.submit(0, "lone", "hello")
        admitted = clock.now
        step_clock(r, clock, admitted + 0.095)
        assert r.engine.batches == [], "released before timeout_ms with room for more"
        step_clock(r, clock, admitted + 0.1 + 2 * STEP_S)
        # the batch reaches the engine on the engine's own thread: wait for it there (a
        # bound in real time), or a busy machine fails this before that thread ran
        assert r.engine.entered.wait(WAIT_S), "the released batch never reached the engine"
        assert r.engine.batches == [("hello",)]
        # the engine runs on its own thread: step until it answered (a bound in real time:
        # the patched monotonic clock is the whole process's)
        deadline = time.perf_counter() + WAIT_S
        while not r.answers():
            assert time.perf_counter() < deadline, "the lone request was never answered"
            clock.now += STEP_S
            r.worker._step(draining=False)
        (result,) = r.results()
        assert 0.1 - STEP_S <= result.timings.batch_wait_s <= 0.1 + 2 * STEP_S


def test_an_idle_worker_commits_what_it_answered_without_waiting_for_the_interval() -> None:
    with rig(timeout_config(3_600_000), GatedEngine(gated=False), delivery="exactly_once") as r:
        r.consumer.rebalance("assign", [P0, P1])
        r.broker.submit(0, "a", "hello")
        r.broker.submit(1, "b", "there")
        # an hour's interval: only the idle rule can commit these answers
        r.step_until(lambda: r.settled({"a", "b"}), "both answered and committed")
        assert {p: o for p, o in r.broker.committed.items() if p in (P0, P1)} == {P0: 1, P1: 1}


def test_the_loop_never_asks_the_broker_for_offsets() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        asked: list[str] = []
        for name in ("get_watermark_offsets", "committed"):
            original = getattr(r.consumer, name)

            def counted(*args: object, _name: str = name, _f: object = original, **kw: object):  # type: ignore[no-untyped-def]
                asked.append(_name)
                return _f(*args, **kw)  # type: ignore[operator]

            setattr(r.consumer, name, counted)
        r.consumer.rebalance("assign", [P0, P1])
        r.broker.submit(0, "a", "hello")
        r.step_until(lambda: r.settled({"a"}), "answered and committed")
        for _ in range(20):
            r.worker._step(draining=False)
        # the assignment reads committed offsets once (resume points), inside the rebalance
        assert "get_watermark_offsets" not in asked

        # measured on the probe's own thread instead
        probe: LagProbe = r.worker.lag
        probe.start()
        try:
            deadline = time.monotonic() + WAIT_S
            while "get_watermark_offsets" not in asked:
                assert time.monotonic() < deadline, "the probe's thread never measured"
                time.sleep(0.01)
        finally:
            probe.stop()
