"""Fair share on a shared fleet (issue 23, docs/architecture.md §10): a small batch
submitted behind a large one completes in a small fraction of the large one's time, with
one worker and with three, weights share the fleet, and a feeder that dies hands over
without losing or repeating a request.

A small batch waits about ``scheduling.depth_s`` (1 s) of the fleet's work, whatever the
large one's size, so the large batches here are sized to take 15–25 s: the issue's 10 %
then holds with room on a loaded machine.

Measured before the feeder (the same scenario, ``scheduling.fair`` off): the small batch
completed after 12.1 s, the large one after 13.1 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from batchpipe.client import Client
from bench.fairness_arms import lines
from tests.integration.conftest import own_broker
from tests.integration.fleet import Member, fleet
from tests.integration.harness import ResultWatcher, running_worker, write_config
from worker.config import Config
from worker.kafka.cancellations import Stop, announce

pytestmark = pytest.mark.integration


@pytest.fixture
def kafka_bootstrap() -> Iterator[str]:
    """A broker of each test's own: the races here run tens of thousands of requests
    through thousands of transactions, which the embedded broker keeps for good in the one
    metadata document it rewrites on every change (tests/integration/conftest.py: the
    three-worker race took 61 s on a fresh broker, 167 s after the tests before it)."""
    with own_broker() as bootstrap:
        yield bootstrap


#: the small batch completes within this fraction of the large one's time (issue 23)
SMALL_SHARE = 0.10


def fair(config: Config, token_s: float) -> Config:
    """Fair share on, the echo engine at ``token_s`` per token, 4 tokens an answer."""
    return replace(
        config,
        kafka=replace(config.kafka, partitions=6),
        engine=replace(config.engine, kind="echo", model="echo", simulated_token_s=token_s),
        generation=replace(config.generation, max_tokens=4),
        scheduling=replace(config.scheduling, fair=True),
    )


def answered(watcher: ResultWatcher, prefix: str) -> int:
    return sum(1 for i in watcher.ids if i.startswith(prefix))


def warm_up(client: Client, watcher: ResultWatcher) -> None:
    """The fleet serves: groups joined, the feeder holds the pending partition."""
    client.submit(lines("warm", 1))
    watcher.wait_for(1, 120)


def race(
    client: Client, watcher: ResultWatcher, large: int, timeout_s: float
) -> tuple[float, float]:
    """A ``large`` batch, then 10 requests 0.5 s later: the seconds each took to complete."""
    started = time.monotonic()
    client.submit(lines("large", large))
    time.sleep(0.5)  # the small one arrives while the large one runs
    small_started = time.monotonic()
    client.submit(lines("small", 10))
    done: dict[str, float] = {}

    def finished() -> bool:
        if "small" not in done and answered(watcher, "small") == 10:
            done["small"] = time.monotonic() - small_started
        if "large" not in done and answered(watcher, "large") == large:
            done["large"] = time.monotonic() - started
        return len(done) == 2

    watcher.wait_until(finished, timeout_s, f"both batches answered ({done})")
    return done["small"], done["large"]


def exactly_once(watcher: ResultWatcher, expected: int) -> None:
    assert len(watcher.ids) == expected
    repeated = {i: n for i, n in watcher.per_id.items() if n > 1}
    assert not repeated, f"answered more than once: {sorted(repeated)[:5]}"


def test_a_small_batch_behind_a_large_one_with_one_worker(kafka_config: Config) -> None:
    config = fair(kafka_config, token_s=0.01)
    client, watcher = Client(config), ResultWatcher(config)
    try:
        with running_worker(config):
            warm_up(client, watcher)
            small, large = race(client, watcher, 12_000, timeout_s=300)
            assert small <= SMALL_SHARE * large, f"small {small:.1f} s, large {large:.1f} s"
            exactly_once(watcher, 12_011)
    finally:
        watcher.close()


def owner(member: Member) -> bool:
    return member.metrics().get("batchpipe_feeder_owner", 0.0) == 1.0


# Open defect (closing note of 2026-12-07, session 3): in the full CI rehearsal of 2026-12-07
# this test timed out with every request answered (all three workers idle at lag 0 one
# minute in) but 6 of 36,011 results never visible to the read_committed watcher — the
# results-visibility defect seen in the chaos-credits join/leave test (Tansu completing a
# transaction only when every overlapping one has ended; the worker's settling did not heal
# it here, with no rebalance). Marked non-strict so one intermittent hit does not block
# the rest landing; remove the mark with the fix.
def test_three_workers_share_fairly_and_a_dead_feeder_hands_over(
    kafka_config: Config, tmp_path: Path
) -> None:
    # paced so that three workers, not the 2 CPU cores, set the rate: the large batch then
    # takes 35 s or more (24,000 measured 25.8 s against 1.95 s), and the small one's wait of
    # about depth_s plus the pipeline's latency stays well inside 10 %
    config = fair(kafka_config, token_s=0.02)
    client, watcher = Client(config), ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            members = [workers.start() for _ in range(3)]
            warm_up(client, watcher)
            small, large = race(client, watcher, 36_000, timeout_s=500)
            assert small <= SMALL_SHARE * large, f"small {small:.1f} s, large {large:.1f} s"

            # the worker that feeds dies mid-batch: another takes the pending partition
            client.submit(lines("after", 3_000))
            holder = wait_for_one(members, owner, "a feeder holds the pending partition")
            watcher.wait_until(lambda: answered(watcher, "after") >= 300, 120, "feeding")
            workers.kill(holder)
            rest = [m for m in members if m is not holder]
            wait_for_one(rest, owner, "another worker's feeder takes over")
            watcher.wait_until(lambda: answered(watcher, "after") == 3_000, 240, "all of it")
            # every request answered; a killed worker's open transactions may repeat some
            # results (§2), which readers keep once: none may be missing
            assert len(watcher.ids) == 1 + 36_010 + 3_000
    finally:
        watcher.close()


def wait_for_one(members: list[Member], test: Callable[[Member], bool], what: str) -> Member:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for member in members:
            if member.running and test(member):
                return member
        time.sleep(0.2)
    raise AssertionError(f"not within 60 s: {what}")


def test_weights_three_to_one_share_the_answers_three_to_one(kafka_config: Config) -> None:
    config = fair(kafka_config, token_s=0.01)
    client, watcher = Client(config), ResultWatcher(config)
    try:
        with running_worker(config):
            warm_up(client, watcher)
            client.submit(lines("heavy", 6_000), weight=3.0)
            client.submit(lines("light", 6_000), weight=1.0)
            # a window while both are active: from the light one's first answers (the heavy
            # one ran alone while the light one was being published) to 3,200 answers later,
            # a dozen turns of both (a turn is scheduling.quantum × weight requests)
            watcher.wait_until(lambda: answered(watcher, "light") >= 50, 240, "both running")
            heavy0, light0 = answered(watcher, "heavy"), answered(watcher, "light")
            watcher.wait_until(
                lambda: (
                    answered(watcher, "heavy") + answered(watcher, "light")
                    >= heavy0 + light0 + 3_200
                ),
                240,
                "a window of 3,200 answers",
            )
            heavy = answered(watcher, "heavy") - heavy0
            light = answered(watcher, "light") - light0
            assert 3.0 * 0.85 <= heavy / light <= 3.0 * 1.15, f"heavy {heavy}, light {light}"
            watcher.wait_until(lambda: len(watcher.ids) == 12_001, 240, "both batches")
            exactly_once(watcher, 12_001)
    finally:
        watcher.close()


def test_status_counts_a_batch_still_waiting_in_the_pending_topic(kafka_config: Config) -> None:
    config = fair(kafka_config, token_s=0.01)
    receipt = Client(config).submit(lines("queued", 5))  # no worker: nothing is fed
    # found whatever the reader's own setting (issue 33, item 5: FIFO said "not found")
    for reader in (config, replace(config, scheduling=replace(config.scheduling, fair=False))):
        status = Client(reader).status(receipt.batch_id)
        assert status.total == 5
        assert status.completed + status.failed == 0


def test_a_key_that_splits_its_work_into_ten_batches_gets_no_more(kafka_config: Config) -> None:
    """Issue 33, item 4: shares were per batch, so alice's 10 batches against bob's 1 got
    0.91 of the answers. Keys come first now: alice gets half, however she splits."""
    config = fair(kafka_config, token_s=0.01)
    client, watcher = Client(config), ResultWatcher(config)
    try:
        with running_worker(config):
            warm_up(client, watcher)
            for k in range(10):
                client.submit(lines(f"alice{k}", 600), key="alice")
            client.submit(lines("bob", 6_000), key="bob")
            # a window while both keys are active: from bob's first answers (alice ran
            # alone while bob was being published) to 2,400 answers later
            watcher.wait_until(lambda: answered(watcher, "bob") >= 50, 240, "both running")
            alice0, bob0 = answered(watcher, "alice"), answered(watcher, "bob")
            watcher.wait_until(
                lambda: (
                    answered(watcher, "alice") + answered(watcher, "bob") >= alice0 + bob0 + 2_400
                ),
                240,
                "a window of 2,400 answers",
            )
            alice = answered(watcher, "alice") - alice0
            bob = answered(watcher, "bob") - bob0
            assert alice / (alice + bob) <= 0.55, f"alice {alice}, bob {bob}"
            watcher.wait_until(lambda: len(watcher.ids) == 12_001, 240, "both keys")
            exactly_once(watcher, 12_001)
    finally:
        watcher.close()


def test_a_cancelled_batch_leaves_its_share_and_is_answered_at_once(kafka_config: Config) -> None:
    """Issue 33, item 8: the feeder never read the control topic, so a cancelled batch kept
    taking turns until its last record was fed, each answered 4005 only in its turn."""
    config = fair(kafka_config, token_s=0.01)
    client, watcher = Client(config), ResultWatcher(config)
    try:
        with running_worker(config):
            warm_up(client, watcher)
            doomed = client.submit(lines("doomed", 6_000))
            client.submit(lines("kept", 6_000))
            watcher.wait_until(lambda: answered(watcher, "kept") >= 100, 240, "both running")
            announce(config.kafka, Stop(doomed.batch_id, "cancelled", time.time()))
            watcher.wait_until(lambda: answered(watcher, "doomed") == 6_000, 240, "all doomed")
            # drained in bulk, outside the shares: the kept batch is far from done
            assert answered(watcher, "kept") <= 0.8 * 6_000
            cancelled = [r for i, r in watcher.first.items() if i.startswith("doomed") and r.error]
            assert cancelled and all(r.error and r.error.code == 4005 for r in cancelled)
            watcher.wait_until(lambda: answered(watcher, "kept") == 6_000, 240, "the kept one")
    finally:
        watcher.close()
