"""The chaos suite: the worker fleet is scaled, flapped, killed and hung, and every
request is still answered exactly once (poison pills: ``test_chaos_poison.py``).

Workers are real ``batchpipe worker`` processes (:mod:`tests.integration.fleet`) on one
consumer group; the echo engine paces itself like a model (``engine.simulated_token_s``),
so a 10-token answer at 1 s a token makes a 10 s batch without a model. Each scenario
ends in :func:`tests.integration.scenario.conclude`, which asserts the guarantees and
adds the scenario's row to the report (``BATCHPIPE_CHAOS_REPORT``).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.chaos_report import ChaosReport
from tests.integration.fleet import Fleet, Member, assigned, busy, fleet
from tests.integration.harness import ResultWatcher, publish, write_config
from tests.integration.scenario import (
    EXIT_GRACE_S,
    KILLED_ON_TANSU,
    conclude,
    merged,
    paced,
    requests,
)
from worker.config import Config

pytestmark = pytest.mark.integration


def test_chaos_scale_up_while_long_batches_run(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """1 → 3 workers while 10 s batches run: the rebalances must not strand paused
    partitions (measured before the fix: 98 of 200 answered, then nothing)."""
    config = paced(kafka_config, token_s=1.0)
    n, batch_id = 200, "scale-up"
    published = publish(config, requests(n, batch_id), keyed=True)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            first = workers.start()
            workers.wait(first, busy, 60, "the first worker runs a batch")
            second = workers.start()
            workers.wait(second, assigned, 60, "the second worker joins")
            third = workers.start()
            workers.wait(third, assigned, 60, "the third worker joins")
            conclude(
                "scale-up 1 → 3 workers during 10 s batches",
                config,
                published.ends,
                {batch_id: [r.custom_id for r in requests(n, batch_id)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=180,
            )
    finally:
        watcher.close()


def _three_one_busy(workers: Fleet) -> Member:
    """Three workers in the group; returns the first once it runs a batch."""
    victim, *others = (workers.start() for _ in range(3))
    for member in others:
        workers.wait(member, assigned, 60, "a worker joins")
    workers.wait(victim, busy, 60, "the first worker runs a batch")
    return victim


def test_chaos_scale_down_sigterm_one_of_three(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """SIGTERM one of three workers while it runs a 10 s batch: it drains and exits 0, the
    other two answer the rest."""
    config = paced(kafka_config, token_s=1.0)
    n, batch_id = 240, "scale-down"
    published = publish(config, requests(n, batch_id), keyed=True)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            victim = _three_one_busy(workers)
            timeout_s = config.worker.drain_timeout_s + EXIT_GRACE_S
            assert workers.stop(victim, timeout_s) == 0
            conclude(
                "scale-down: SIGTERM 1 of 3 during 10 s batches",
                config,
                published.ends,
                {batch_id: [r.custom_id for r in requests(n, batch_id)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=180,
            )
    finally:
        watcher.close()


def test_chaos_flapping_worker(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """A second worker joins and leaves five times while one steady worker serves 500
    requests, published in five parts so that every flap happens mid-run."""
    config = paced(kafka_config, token_s=0.2)
    flaps, per_flap, batch_id = 5, 100, "flapping"
    n = flaps * per_flap
    ends: dict[int, int] = {}
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            steady = workers.start()
            for flap in range(flaps):
                part = requests(per_flap, batch_id, start=flap * per_flap, total=n)
                ends = merged(ends, publish(config, part, keyed=True).ends)
                workers.wait(steady, busy, 60, "the steady worker has work")
                flapper = workers.start()
                workers.wait(flapper, assigned, 60, f"flap {flap + 1}: the worker joins")
                timeout_s = config.worker.drain_timeout_s + EXIT_GRACE_S
                assert workers.stop(flapper, timeout_s) == 0, f"flap {flap + 1}"
            conclude(
                "flapping: a worker joins and leaves 5 times",
                config,
                ends,
                {batch_id: [f"r{i}" for i in range(n)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=180,
            )
    finally:
        watcher.close()


def test_chaos_engine_hang_restarted_on_failed_liveness(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """The engine hangs past ``engine_timeout_s``: ``/healthz`` must fail, the test then
    restarts the worker as Kubernetes would, and the next owner answers."""
    config = paced(kafka_config, token_s=0.01)
    config = replace(config, engine=replace(config.engine, engine_timeout_s=3.0))
    n, batch_id = 100, "hang"
    published = publish(config, requests(n, batch_id), keyed=True)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            # 10 tokens at 60 s each: the first batch outlives engine_timeout_s by far
            hung = workers.start("engine.simulated_token_s=60")
            workers.wait_unhealthy(hung, timeout_s=90)
            workers.restart(hung)
            conclude(
                "engine hang: /healthz fails, restart",
                config,
                published.ends,
                {batch_id: [r.custom_id for r in requests(n, batch_id)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=120,
                raw_duplicates_because=KILLED_ON_TANSU,
            )
    finally:
        watcher.close()


@pytest.mark.parametrize("partitions", [6, 64])
def test_sigkill_three_times_loses_nothing(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport, partitions: int
) -> None:
    """Three SIGKILLs at random points of a 3,000-request run, each followed by a restart;
    with 64 partitions one worker commits all of them in one transaction, and each
    replacement reclaims the 64 partitions' transactional ids."""
    config = paced(kafka_config, token_s=0.002)
    config = replace(config, kafka=replace(config.kafka, partitions=partitions))
    n, batch_id = 3000, f"sigkill-{partitions}"
    published = publish(config, requests(n, batch_id), keyed=True)
    watcher = ResultWatcher(config)
    kill_points = sorted(random.Random(3).sample(range(300, n - 300), 3))
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            worker = workers.start()
            for point in kill_points:
                watcher.wait_for(point, timeout_s=120)
                before = len(watcher.ids)
                worker = workers.restart(worker)
                watcher.wait_for(before + 1, timeout_s=120)
            conclude(
                "3 SIGKILLs in 3,000 requests"
                + ("" if partitions == 6 else f", {partitions} partitions"),
                config,
                published.ends,
                {batch_id: [r.custom_id for r in requests(n, batch_id)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=180,
                raw_duplicates_because=KILLED_ON_TANSU,
            )
    finally:
        watcher.close()


#: Seconds from killing a worker for good until every answer is visible to read_committed
#: readers: its session times out (6 s), the group rebalances, the survivors reclaim its
#: transactional id (aborting the transaction it left open) and answer its partitions' last
#: uncommitted records again (1,200 requests at 2 ms a token take about 30 s on 2 cores).
KILLED_FOR_GOOD_BOUND_S = 90.0


def test_a_worker_killed_for_good_holds_no_reader_back(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """One of three workers is SIGKILLed mid-run and never comes back, while a
    read_committed reader waits: its open transaction must not hide later answers for
    good (the embedded broker never times a transaction out), so every answer is visible
    within :data:`KILLED_FOR_GOOD_BOUND_S` of the kill."""
    config = paced(kafka_config, token_s=0.002)
    n, batch_id = 1200, "killed-for-good"
    published = publish(config, requests(n, batch_id), keyed=True)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            workers.kill(_three_one_busy(workers))
            conclude(
                "SIGKILL 1 of 3 for good, read_committed reader waiting",
                config,
                published.ends,
                {batch_id: [r.custom_id for r in requests(n, batch_id)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=KILLED_FOR_GOOD_BOUND_S,
                raw_duplicates_because=KILLED_ON_TANSU,
            )
    finally:
        watcher.close()
