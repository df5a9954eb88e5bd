"""Exactly one answer on the results topic itself through rebalances and a lost generation
(issue 40): counted on the topic read read_committed (:func:`scenario.conclude`), never
after ``collect``'s dedup.

Workers are real ``batchpipe worker`` processes; the echo engine runs in flight and paces
itself like a model, so requests of mixed lengths complete out of order — the condition
under which an answer beyond its partition's committed offset used to be handed over and
answered again by the next owner (74 of 600 ids twice before the fix).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.chaos_report import ChaosReport
from tests.integration.fleet import Fleet, Member, assigned, assignments, busy, fleet
from tests.integration.harness import ResultWatcher, publish, write_config
from tests.integration.scenario import EXIT_GRACE_S, conclude, paced
from worker.config import Config
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

pytestmark = pytest.mark.integration

#: Seconds for a rebalance of a few workers on the embedded broker (about 3 s each)
REBALANCE_BOUND_S = 60.0


def mixed_lengths(n: int, batch_id: str) -> list[InferenceRequest]:
    """``n`` requests, nine in ten of 2 tokens and one in ten of 40: long stragglers with
    short requests after them on the same partition."""
    lengths = random.Random(40)
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            batch_id=batch_id,
            batch_total=n,
            messages=(ChatMessage("user", f"mixed request {i:05d} " + "x" * 60),),
            sampling=SamplingParams(
                max_tokens=40 if lengths.random() < 0.1 else 2, temperature=0.0
            ),
            submitted_at=time.time(),
        )
        for i in range(n)
    ]


def in_flight(config: Config, token_s: float) -> Config:
    config = paced(config, token_s=token_s)
    return replace(config, engine=replace(config.engine, echo_mode="in_flight"))


@dataclass(frozen=True)
class Run:
    """One scenario's published requests and what watches them."""

    config: Config
    batch_id: str
    sent: list[InferenceRequest]
    ends: dict[int, int]
    watcher: ResultWatcher

    def conclude(
        self, name: str, workers: Fleet, report: ChaosReport, tmp: Path, **kw: Any
    ) -> None:
        ids = {self.batch_id: [r.custom_id for r in self.sent]}
        conclude(name, self.config, self.ends, ids, self.watcher, workers, report, tmp, **kw)


def started(config: Config, n: int, batch_id: str) -> Run:
    """``n`` requests of mixed lengths published, and a watcher of the answers."""
    sent = mixed_lengths(n, batch_id)
    ends = dict(publish(config, sent, keyed=True).ends)
    return Run(config, batch_id, sent, ends, ResultWatcher(config))


def wait_assigned_again(workers: Fleet, member: Member, before: float, what: str) -> None:
    """Until ``member`` has served more than ``before`` assignments."""
    workers.wait(member, lambda m: assignments(m) > before, REBALANCE_BOUND_S, what)


def test_chaos_in_flight_mixed_lengths_workers_join_and_leave(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """1 → 3 workers while requests of 2 and 40 tokens run in flight, then two leave with
    SIGTERM and one more joins: every id answered, no repeat on the results topic."""
    config = in_flight(kafka_config, token_s=0.1)
    run = started(config, 600, "mixed-join-leave")
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            first = workers.start()
            workers.wait(first, busy, 60, "the first worker runs requests")
            joined = [workers.start(), workers.start()]
            for member in joined:
                workers.wait(member, assigned, REBALANCE_BOUND_S, "a worker joins")
            timeout_s = config.worker.drain_timeout_s + EXIT_GRACE_S
            assert workers.stop(joined[0], timeout_s) == 0
            late = workers.start()
            workers.wait(late, assigned, REBALANCE_BOUND_S, "a fourth worker joins")
            assert workers.stop(joined[1], timeout_s) == 0
            run.conclude(
                "in flight, 2- and 40-token requests: 1 → 3 workers, 2 leave (SIGTERM), 1 joins",
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=240,
            )
    finally:
        run.watcher.close()


def test_a_worker_paused_past_its_session_rejoins_without_exiting(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """One of two workers is SIGSTOPped while it runs requests, until the group has moved
    on without it (its session timed out) and the other worker claimed its transactional
    id. Resumed, it meets a lost generation (fenced, or its assignment lost), drops its
    producer and partitions, rejoins the group and serves again, its engine still loaded:
    it never exits (it used to exit 1, and on a GPU reload its model for minutes)."""
    config = in_flight(kafka_config, token_s=0.05)
    run = started(config, 800, "paused")
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            steady, paused = workers.start(), workers.start()
            for member in (steady, paused):
                workers.wait(member, assigned, REBALANCE_BOUND_S, "both workers join")
            workers.wait(paused, busy, 60, "the worker to pause runs requests")
            steady_before, paused_before = (
                assignments(steady.metrics()),
                assignments(paused.metrics()),
            )
            workers.pause(paused)
            try:
                # its session timed out: the group rebalanced without it
                wait_assigned_again(workers, steady, steady_before, "the group moves on")
            finally:
                workers.resume(paused)
            workers.wait(
                paused,
                lambda m: (
                    assignments(m) > paused_before
                    and m.get('batchpipe_rebalances_total{kind="lost"}', 0.0) >= 1
                ),
                REBALANCE_BOUND_S,
                "the resumed worker lost its generation and was assigned again",
            )
            run.conclude(
                "SIGSTOP 1 of 2 past its session timeout, then SIGCONT",
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=240,
                # Tansu does not check the group generation on TxnOffsetCommit (§7): a
                # commit the paused worker had in flight can still land when it resumes,
                # before the fence stops it; Apache Kafka refuses it (KIP-447)
                raw_duplicates_because="the embedded broker does not fence a commit by "
                "group generation",
            )
            assert paused.running  # rejoined, never exited
    finally:
        run.watcher.close()
