"""Fair share's two harder workloads (issue 39), measured by :mod:`bench.fairness` in the
same run as its other arms, each against its own reference:

* **mixed lengths**: one worker, the in-flight echo engine (:data:`MIXED_TOKEN_S` a
  decoding step, ``max_batch_size`` sequences at once), one batch of ``--mixed``
  requests of which every 20th (5 %) generates :data:`LONG_TOKENS` tokens and the others
  :data:`SHORT_TOKENS` (50× longer). FIFO (``scheduling.fair`` off) and fair; requests/s,
  fair ÷ FIFO. Under the old depth rule one long generation pinned its partition's
  committed offset and feeding stopped (0.37× in the issue).
* **cancel**: fair share on, one worker at 20 ms a step, a large batch running; then,
  *with* the cancel, a 5,000-request batch is submitted, shares the worker, is cancelled
  and drained (every record answered 4005); then :data:`AFTER` 10-request batches, one
  every ``--every`` seconds. *Without*: the same small batches behind the same large one.
  Reported: each small batch's completion time, the median with ÷ without, and the
  evidence of where the time went — for each small batch, when its records were fed
  (their timestamp on the requests topic) and how many of the large batch's records were
  fed but not answered when it was submitted (what it queued behind).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.fairness_arms import Arm, lines, serving
from bench.latency import wait_for
from tests.integration.harness import reader
from worker.errors import RequestError
from worker.kafka.cancellations import Stop, announce
from worker.wire.codec import CodecLimits, decode_request

MIXED_TOKEN_S = 0.02
SHORT_TOKENS, LONG_TOKENS = 4, 200
LONG_EVERY = 20  # every 20th request is a long one: 5 %
CANCEL_TOKEN_S = 0.02
DOOMED = 5_000
AFTER = 5


def mixed_lines(prefix: str, n: int) -> list[dict[str, Any]]:
    """``n`` echo requests, every :data:`LONG_EVERY`-th generating :data:`LONG_TOKENS`
    tokens and the others :data:`SHORT_TOKENS` (echo repeats the message, so a long one's
    message is longer than its answer)."""
    rows = lines(prefix, n)
    for i, row in enumerate(rows):
        body = row["body"]
        if i % LONG_EVERY == 0:
            body["max_tokens"] = LONG_TOKENS
            body["messages"][0]["content"] += " " + "x" * LONG_TOKENS
        else:
            body["max_tokens"] = SHORT_TOKENS
    return rows


def mixed_lengths(bootstrap: str, n: int) -> dict[str, Any]:
    """FIFO and fair on the same mixed-length batch: requests/s, fair ÷ FIFO."""
    arms: dict[str, dict[str, Any]] = {}
    for mode in ("fifo", "fair"):
        arm = Arm(bootstrap, MIXED_TOKEN_S, mode == "fair", echo_mode="in_flight")
        with serving(arm) as running:
            _, ids = running.publish("mixed", mixed_lines("mixed", n))
            wait_for(running.seen, ids, 1800)
            seconds = running.done_at(ids) - running.submitted["mixed"]
            arms[mode] = {"seconds": round(seconds, 2), "requests_per_s": round(n / seconds, 2)}
    return {
        "token_s": MIXED_TOKEN_S,
        "requests": n,
        "long_share": 1 / LONG_EVERY,
        "tokens": {"short": SHORT_TOKENS, "long": LONG_TOKENS},
        "max_sequences": arm.config.batching.max_batch_size,
        **arms,
        "throughput_fair_vs_fifo": round(
            arms["fair"]["requests_per_s"] / arms["fifo"]["requests_per_s"], 3
        ),
    }


def cancel(bootstrap: str, large: int, every: float) -> dict[str, Any]:
    """Small batches behind a large one, without and after a 5,000-request cancel."""
    arms: dict[str, dict[str, Any]] = {}
    for plan in ("without", "with"):
        with serving(Arm(bootstrap, CANCEL_TOKEN_S, True)) as arm:
            big = arm.submit("large", large)
            until_answered(arm, big, 500, "the large batch runs")
            row: dict[str, Any] = {}
            if plan == "with":
                batch_id, doomed = arm.publish("doomed", lines("doomed", DOOMED))
                until_answered(arm, doomed, 100, "the doomed batch runs")
                cancelled_at = time.time()
                announce(arm.config.kafka, Stop(batch_id, "cancelled", cancelled_at))
                wait_for(arm.seen, doomed, 600)  # drained: answered 4005 outside the shares
                row["doomed_run"] = answered(arm, doomed, before=cancelled_at)
                row["drain_s"] = round(arm.done_at(doomed) - cancelled_at, 2)
            smalls: list[tuple[str, list[str]]] = []
            for k in range(AFTER):
                time.sleep(every)
                smalls.append((f"small{k}", arm.submit(f"small{k}", 10)))
            for _, ids in smalls:
                wait_for(arm.seen, ids, 600)
            wait_for(arm.seen, big, 1800)
            fed = fed_at(arm, [i for _, ids in smalls for i in ids] + big)
            row["small"] = [_evidence(arm, name, ids, big, fed) for name, ids in smalls]
            row["small_median_s"] = statistics.median(s["seconds"] for s in row["small"])
            arms[plan] = row
    return {
        "token_s": CANCEL_TOKEN_S,
        "large": large,
        "doomed": DOOMED,
        **arms,
        "small_with_vs_without": round(
            arms["with"]["small_median_s"] / arms["without"]["small_median_s"], 2
        ),
    }


def _evidence(
    arm: Arm, name: str, ids: list[str], big: list[str], fed: dict[str, float]
) -> dict[str, Any]:
    submitted = arm.submitted[name]
    with arm.seen.lock:
        ahead = sum(
            1 for i in big if fed[i] <= submitted < arm.seen.answers[i][0]
        )  # fed, not answered: what it queues behind
    last_fed = max(fed[i] for i in ids)
    done = arm.done_at(ids)
    return {
        "seconds": round(done - submitted, 3),
        "fed_after_s": round(last_fed - submitted, 3),
        "answered_after_fed_s": round(done - last_fed, 3),
        "large_fed_unanswered_at_submit": ahead,
    }


def answered(arm: Arm, ids: Sequence[str], before: float = float("inf")) -> int:
    with arm.seen.lock:
        return sum(1 for i in ids if i in arm.seen.answers and arm.seen.answers[i][0] < before)


def until_answered(arm: Arm, ids: Sequence[str], count: int, what: str) -> None:
    deadline = time.monotonic() + 120
    while answered(arm, ids) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within 120 s: {what}")
        time.sleep(0.05)


def fed_at(arm: Arm, ids: Sequence[str], timeout_s: float = 120) -> dict[str, float]:
    """When each of ``ids`` was fed: its record's timestamp on the requests topic."""
    wanted, found = set(ids), dict[str, float]()
    limits = CodecLimits.from_config(arm.config.limits)
    consumer = reader(arm.config, arm.config.kafka.requests_topic, read_committed=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not wanted <= found.keys():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(wanted - found.keys())} requests never fed")
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is not None:
                    continue
                try:
                    request = decode_request(msg.value(), msg.headers(), limits)
                except RequestError:
                    continue
                if request.custom_id in wanted:
                    found.setdefault(request.custom_id, msg.timestamp()[1] / 1000)
    finally:
        consumer.close()
    return found
