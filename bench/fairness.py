"""Fair share: small batches arriving while a large one runs, with and without the feeder.

One embedded broker, one worker, the echo engine paced at 20 ms and at 1 s per decoding
step (4 tokens an answer; the large batch sized per pace so an arm takes under a minute),
each pace in one run of:

1. **alone**: the large batch (``--large`` requests) alone, with ``scheduling.fair`` off
   (today's FIFO) and on — single-batch throughput, fair against FIFO;
2. **small alone**: one 10-request batch alone (fair on) — the time a small batch needs
   when nothing else runs;
3. **mixed**, FIFO and fair: the large batch, then ten 10-request batches submitted one
   every ``--every`` seconds while it runs. Reported per small batch: its completion time
   ÷ its time alone (a small batch's own rate says nothing of its share: ten requests
   take the pipeline's latency, whatever the share);
4. **concurrent**, FIFO and fair: four batches of ``--large``/4 requests submitted
   together; Jain's fairness index of the requests each got answered while all four were
   active (1.0: equal shares; 0.25: one batch got everything), each batch's first and
   last answer, and their total requests/s, fair against FIFO.

Then, at 1 s a step, the large batch alone on **three workers**, FIFO and fair; the
**mixed-length** batch on the in-flight engine and the small batches after a **cancel**
(:mod:`bench.fairness_variants`, on the arms of :mod:`bench.fairness_arms`); and the
feeder's mover alone (:mod:`bench.mover`: one, four and 64 active batches).

    .venv/bin/python -m bench.fairness [--large-20ms 8000] [--large-1s 320] [--every 0.5]
        [--mixed 3000] [--cancel-large 8000]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from typing import Any

from bench import fairness_variants as variants
from bench import mover
from bench.common import write_result
from bench.fairness_arms import Arm, serving
from bench.latency import wait_for
from worker.kafka.broker import EmbeddedBroker

SMALL = 10
SMALL_BATCHES = 10
#: seconds a decoding step, and the large batch's default size at that pace
PACES = ((0.02, 8_000), (1.0, 320))


def jain(rates: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when every rate is equal, 1/n when one gets everything."""
    total, squares = sum(rates), sum(r * r for r in rates)
    return total * total / (len(rates) * squares) if squares else 1.0


def run_arm(
    bootstrap: str,
    token_s: float,
    fair: bool,
    plan: str,
    large: int,
    every: float,
    workers: int = 1,
) -> dict[str, Any]:
    with serving(Arm(bootstrap, token_s, fair), workers) as arm:
        if plan == "concurrent":
            return _concurrent(arm, large // 4)
        if plan == "small":
            ids = arm.submit("small", SMALL)
            wait_for(arm.seen, ids, 120)
            return {"seconds": round(arm.done_at(ids) - arm.submitted["small"], 3)}
        ids = arm.submit("large", large)
        smalls: list[tuple[str, list[str]]] = []
        if plan == "mixed":
            for k in range(SMALL_BATCHES):
                time.sleep(every)
                smalls.append((f"small{k}", arm.submit(f"small{k}", SMALL)))
        wait_for(arm.seen, ids, 1800)
        for _, small in smalls:
            wait_for(arm.seen, small, 600)
        seconds = arm.done_at(ids) - arm.submitted["large"]
        row: dict[str, Any] = {
            "large_seconds": round(seconds, 2),
            "large_requests_per_s": round(large / seconds, 2),
        }
        if plan == "mixed":
            row["small"] = [_small(arm, name, ids) for name, ids in smalls]
        return row


def _small(arm: Arm, name: str, ids: list[str]) -> dict[str, Any]:
    return {"seconds": round(arm.done_at(ids) - arm.submitted[name], 3)}


def _concurrent(arm: Arm, each: int) -> dict[str, Any]:
    batches: list[list[str]] = [[] for _ in range(4)]
    started = time.time()

    def submit(k: int) -> None:  # together: none gets a head start while another publishes
        batches[k] = arm.submit(f"c{k}", each)

    publishers = [threading.Thread(target=submit, args=(k,)) for k in range(4)]
    for publisher in publishers:
        publisher.start()
    for publisher in publishers:
        publisher.join()
    for ids in batches:
        wait_for(arm.seen, ids, 1800)
    with arm.seen.lock:
        firsts = [min(arm.seen.answers[i][0] for i in ids) for ids in batches]
    start, end = max(firsts), min(arm.done_at(ids) for ids in batches)
    shares = [arm.answered_between(ids, start, end) for ids in batches]
    last = max(arm.done_at(ids) for ids in batches)
    return {
        "requests_per_s": round(4 * each / (last - started), 2),
        "window_s": round(end - start, 2),
        "answered_in_window": shares,
        "jain": round(jain(shares), 3) if end > start else 0.25,
        # per batch, its first and last answer after the submit: which one went first
        "first_last_s": [
            [round(first - started, 2), round(arm.done_at(ids) - started, 2)]
            for first, ids in zip(firsts, batches, strict=True)
        ],
    }


def run_pace(bootstrap: str, token_s: float, large: int, every: float) -> dict[str, Any]:
    """Every arm at one pace, side by side."""

    def arm(fair: bool, plan: str) -> dict[str, Any]:
        return run_arm(bootstrap, token_s, fair, plan, large, every)

    alone = {"fifo": arm(False, "alone"), "fair": arm(True, "alone")}
    small_alone = {"fifo": arm(False, "small")["seconds"], "fair": arm(True, "small")["seconds"]}
    mixed = {mode: arm(mode == "fair", "mixed") for mode in ("fifo", "fair")}
    concurrent = {mode: arm(mode == "fair", "concurrent") for mode in ("fifo", "fair")}
    for row in mixed.values():
        for small in row["small"]:
            small["slowdown"] = round(small["seconds"] / small_alone["fair"], 2)
    result: dict[str, Any] = {
        "token_s": token_s,
        "large": large,
        "alone": alone,
        "single_batch_throughput_fair_vs_fifo": round(
            alone["fair"]["large_requests_per_s"] / alone["fifo"]["large_requests_per_s"], 3
        ),
        "small_alone_seconds": small_alone,
        "small_alone_fair_vs_fifo": round(small_alone["fair"] / small_alone["fifo"], 2),
        "mixed": mixed,
        "concurrent": concurrent,
        "concurrent_throughput_fair_vs_fifo": round(
            concurrent["fair"]["requests_per_s"] / concurrent["fifo"]["requests_per_s"], 3
        ),
        "fifo_jain": concurrent["fifo"]["jain"],
        "fair_jain": concurrent["fair"]["jain"],
    }
    for mode, row in mixed.items():
        slowdowns = sorted(s["slowdown"] for s in row["small"])
        result[f"{mode}_small_slowdown_median"] = slowdowns[len(slowdowns) // 2]
        result[f"{mode}_small_slowdown_max"] = slowdowns[-1]
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-20ms", type=int, default=PACES[0][1])
    parser.add_argument("--large-1s", type=int, default=PACES[1][1])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between small batches")
    parser.add_argument("--mixed", type=int, default=3_000, help="mixed-length batch's size")
    parser.add_argument("--cancel-large", type=int, default=8_000, help="large batch (cancel)")
    args = parser.parse_args(argv)

    sizes = {PACES[0][0]: args.large_20ms, PACES[1][0]: args.large_1s}
    with EmbeddedBroker() as broker:
        b = broker.bootstrap
        paces = {f"{t:g}": run_pace(b, t, sizes[t], args.every) for t, _ in PACES}
        slow, three = PACES[1][0], 3 * args.large_1s
        fleet = {
            mode: run_arm(b, slow, mode == "fair", "alone", three, args.every, workers=3)
            for mode in ("fifo", "fair")
        }
        mixed = variants.mixed_lengths(b, args.mixed)
        cancelled = variants.cancel(b, args.cancel_large, args.every)
        moved = mover.run(b, 64_000)
    payload = {
        "setup": {
            "small": SMALL,
            "small_batches": SMALL_BATCHES,
            "every_s": args.every,
            "max_tokens": 4,
            "workers": 1,
        },
        "paces": paces,
        "three_workers": {
            "token_s": slow,
            "large": three,
            **fleet,
            "throughput_fair_vs_fifo": round(
                fleet["fair"]["large_requests_per_s"] / fleet["fifo"]["large_requests_per_s"], 3
            ),
        },
        "mixed_lengths": mixed,
        "cancel": cancelled,
        "mover": moved,
    }
    write_result("fairness", payload)
    print(payload)
    return payload


if __name__ == "__main__":
    main()
