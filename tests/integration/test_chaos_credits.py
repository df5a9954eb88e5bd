"""The chaos suite with the feeder feeding by credits (issue 39, docs/architecture.md §10).

The other chaos scenarios publish straight to the requests topic, so the feeder every
worker runs (``scheduling.fair``, the default) has nothing to feed. Here the batch goes
through the pending topic (:meth:`batchpipe.Client.submit`) and the feeder produces each
record to a partition of a worker with credit, from the workers' demand reports, while
workers join, leave and are killed — the feeder's own worker among them. Each scenario
ends in :func:`tests.integration.scenario.conclude`: every request answered once in what
``collect`` writes, and repeats counted on the results topic itself, read_committed from
its start (none through clean joins and leaves).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from batchpipe.client import Client
from tests.integration.chaos_report import ChaosReport
from tests.integration.fleet import Fleet, Member, assigned, busy, fleet
from tests.integration.harness import ResultWatcher, read_whole, visibility, write_config
from tests.integration.scenario import EXIT_GRACE_S, KILLED_ON_TANSU, conclude, paced, requests
from tests.integration.test_fair_share import owner, wait_for_one
from worker.config import Config

pytestmark = pytest.mark.integration

N = 4_000
TOKEN_S = 0.05  # 10 tokens an answer: a batch of 32 takes 0.5 s, N about 20-40 s
#: what each worker says of itself when the batch is not answered in time: whether it
#: answered requests after all, holds any, feeds, and its lag
STATE = (
    "batchpipe_requests_total",
    "batchpipe_inflight_requests",
    "batchpipe_consumer_lag",
    "batchpipe_feeder_owner",
    "batchpipe_feeder_fed_total",
)


def fed_ends(config: Config, count: int) -> dict[int, int]:
    """Per requests-topic partition, one past the last record the feeder produced there
    (the transaction markers after it are not records a worker commits past)."""
    ends: dict[int, int] = {}
    for msg in read_whole(config, config.kafka.requests_topic, count):
        partition, offset = msg.partition() or 0, msg.offset() or 0
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


Chaos = Callable[[Fleet, list[Member], Config], None]


def _run(
    kafka_config: Config,
    tmp_path: Path,
    report: ChaosReport,
    name: str,
    chaos: Chaos,
    raw_duplicates_because: str = "",
) -> None:
    """Two workers, a batch of ``N`` submitted through the pending topic, ``chaos`` once
    a tenth of it is answered, then :func:`conclude`."""
    config = paced(kafka_config, token_s=TOKEN_S)
    assert config.scheduling.fair  # the default: every worker runs a feeder
    batch_id = chaos.__name__.replace("_", "-")
    batch = requests(N, batch_id)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            members = [workers.start() for _ in range(2)]
            for member in members:
                workers.wait(member, assigned, 60, "a worker joins")
            Client(config).submit(batch, batch_id=batch_id)
            watcher.wait_until(lambda: len(watcher.ids) >= N // 10, 120, "fed by credit")
            chaos(workers, members, config)
            expected = {r.custom_id for r in batch}
            try:
                watcher.wait_until(lambda: watcher.ids >= expected, 300, f"{N} answered")
            except AssertionError as failure:
                raise AssertionError(f"{failure}; {_where_it_stopped(config, workers)}") from None
            conclude(
                name,
                config,
                fed_ends(config, N),
                {batch_id: sorted(expected)},
                watcher,
                workers,
                report,
                tmp_path,
                answer_bound_s=300,
                raw_duplicates_because=raw_duplicates_because,
            )
    finally:
        watcher.close()


def _where_it_stopped(config: Config, workers: Fleet) -> str:
    """Whether the requests were fed and answered, for a batch not answered in time: each
    worker's own counts (:data:`STATE`), and what read_committed readers see of the
    requests and results topics against everything written there."""
    said = []
    for member in workers.members:
        metrics = member.metrics()  # empty once it ended
        counts = ", ".join(f"{name} {metrics.get(name, 0):g}" for name in STATE)
        said.append(
            f"worker {member.process.pid} ({'running' if member.running else 'ended'}): {counts}"
        )
    topics = [
        visibility(config, t) for t in (config.kafka.requests_topic, config.kafka.results_topic)
    ]
    return "; ".join([*said, *topics])


def join_and_leave(workers: Fleet, members: list[Member], config: Config) -> None:
    joined = workers.start()
    workers.wait(joined, busy, 60, "the worker that joined is fed")
    members.append(joined)
    holder = wait_for_one(members, owner, "a feeder feeds")
    assert workers.stop(holder, config.worker.drain_timeout_s + EXIT_GRACE_S) == 0
    rest = [m for m in members if m is not holder]
    wait_for_one(rest, owner, "another worker's feeder takes over")
    workers.wait(workers.start(), assigned, 60, "a fourth worker joins")


# A known defect, open: 1 failure in 55 runs (the full suite's on 2026-12-07; the 54 since
# passed, 45 of them in a row beside a loop of the unit suite, 44.7-49.7 s): 640 results of
# 4,000 read after 300 s. The feeder did not stop: that run's log has the three workers answering
# about 2,700 requests after the last takeover (pending offset 1174; their 30 s summaries
# 37.2, 27.7 and 25.6 req/s, the newest worker's first 1,117) and then idle at lag 0, so
# the batch was fed and answered; the watcher, reading read_committed, saw 640 of it. The
# results were most likely held back, not lost: on the embedded broker a transaction left
# open on a partition (Tansu never times one out, §7) hides every later record there from
# read_committed readers for good, and a worker's transactions write every results
# partition (checked by hand on Tansu 0.6: an ended transaction left PrepareCommit behind an
# open one is completed once a later one on its partition ends; an open one blocks for
# good). Which producer left one open after the last rebalance's claims is not found. A
# failure now says, per partition, what read_committed and read_uncommitted readers find,
# and what each worker counted.
def test_chaos_credits_workers_join_and_the_feeders_worker_leaves(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """A third worker joins mid-batch and is fed (it holds requests only if the feeder
    gave it credit); the worker whose feeder feeds is SIGTERMed, another's feeder takes
    over, a fourth joins. No repeat on the results topic."""
    name = "credits join/leave: 2 → 3 workers, the feeder's worker SIGTERMed, a 4th joins"
    _run(kafka_config, tmp_path, chaos_report, name, join_and_leave)


def kill_twice(workers: Fleet, members: list[Member], config: Config) -> None:
    holder = wait_for_one(members, owner, "a feeder feeds")
    other = next(m for m in members if m is not holder)
    workers.wait(other, busy, 60, "the other worker is fed")
    members.append(workers.restart(other))
    workers.wait(members[-1], assigned, 60, "its replacement joins")
    workers.wait(holder, busy, 60, "the feeder's worker holds requests")
    members.append(workers.restart(holder))
    wait_for_one([m for m in members if m.running], owner, "a live worker's feeder feeds")


def test_chaos_credits_sigkill_a_worker_then_the_feeders_worker(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """A worker holding credit-fed requests is SIGKILLed (its partitions' records are
    answered by whoever is assigned them next) and restarted; then the worker whose
    feeder feeds is SIGKILLed and restarted."""
    name = "credits SIGKILL: a fed worker, then the feeder's worker, each restarted"
    _run(kafka_config, tmp_path, chaos_report, name, kill_twice, KILLED_ON_TANSU)
