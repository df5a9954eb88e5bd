"""The adaptive batch size in the loop: a trickle's shrinks do not cut a burst's first batch
(batcher.adaptive, issue 39: one short first batch shifted every later one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from worker.config import Config

from .fakes import GatedEngine
from .rig import P0, P1, Rig, loop_config, rig


def adaptive_config() -> Config:
    """Adaptive on, sampled at every step: an idle echo engine shrinks the size at once."""
    config = loop_config(prefetch_count=16, max_batch_size=8)
    return replace(config, batching=replace(config.batching, adaptive=True, adaptive_interval_ms=0))


def trickle_then_burst(r: Rig, burst: Callable[[int], int]) -> int:
    """One lone request answered on the idle engine (the size shrinks), then a burst of
    ``burst(shrunk size)`` requests; returns the shrunk size."""
    r.consumer.rebalance("assign", [P0, P1])
    r.broker.submit(0, "lone", "hello")
    r.step_until(lambda: "lone" in r.answers(), "the lone request's answer")
    shrunk = r.worker.batcher.max_batch_size
    for i in range(burst(shrunk)):
        r.broker.submit(0, f"burst-{i}", f"burst {i}")
    return shrunk


def test_a_burst_after_a_trickle_runs_a_whole_first_batch() -> None:
    with rig(adaptive_config(), GatedEngine(gated=False)) as r:
        shrunk = trickle_then_burst(r, lambda _: 12)
        assert shrunk < 8, "the lone request on an idle engine should have shrunk the size"
        r.step_until(lambda: len(r.engine.batches) >= 3, "the burst's batches")
        assert [len(b) for b in r.engine.batches] == [1, 8, 4]
        r.step_until(lambda: r.settled({f"burst-{i}" for i in range(12)}), "every answer")


def test_a_burst_smaller_than_the_old_size_restores_only_what_it_fills() -> None:
    with rig(adaptive_config(), GatedEngine(gated=False)) as r:
        # one more than the shrunk size, fewer than the old one
        burst = trickle_then_burst(r, lambda shrunk: shrunk + 1) + 1
        assert burst < 8
        r.step_until(lambda: len(r.engine.batches) >= 2, "the burst's batch")
        assert len(r.engine.batches[1]) == burst
        r.step_until(lambda: r.settled({f"burst-{i}" for i in range(burst)}), "every answer")
