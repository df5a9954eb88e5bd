"""Fair share: small batches arriving while a large one runs, with and without the feeder.

One embedded broker, one worker, the echo engine paced at ``--token-s`` per decoding step
(4 tokens an answer), in one run:

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
   active (1.0: equal shares; 0.25: one batch got everything).

    .venv/bin/python -m bench.fairness [--large 20000] [--token-s 0.005] [--every 0.5]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from batchpipe.client import Client
from bench.common import fresh_config, write_result
from bench.latency import Seen, read_answers, wait_for
from tests.integration.harness import running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker

SMALL = 10
SMALL_BATCHES = 10


def lines(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": [{"role": "user", "content": f"{prefix} {i}"}]},
        }
        for i in range(n)
    ]


def jain(rates: Sequence[float]) -> float:
    """Jain's fairness index: 1.0 when every rate is equal, 1/n when one gets everything."""
    total, squares = sum(rates), sum(r * r for r in rates)
    return total * total / (len(rates) * squares) if squares else 1.0


class Arm:
    """A worker on fresh topics with fair share on or off, and a reader of its answers."""

    def __init__(self, bootstrap: str, token_s: float, fair: bool) -> None:
        config = fresh_config(bootstrap)
        engine = EngineConfig(kind="echo", model="echo", simulated_token_s=token_s)
        self.config: Config = replace(
            config,
            engine=engine,
            generation=replace(config.generation, max_tokens=4),
            scheduling=replace(config.scheduling, fair=fair),
        )
        k = self.config.kafka
        # the reader is assigned the results partitions that exist when it starts
        clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
        self.client = Client(self.config)
        self.seen = Seen({}, threading.Lock())
        self.submitted: dict[str, float] = {}

    def submit(self, prefix: str, n: int) -> list[str]:
        self.submitted[prefix] = time.time()
        self.client.submit(lines(prefix, n))
        return [f"{prefix}-{i}" for i in range(n)]

    def done_at(self, ids: Sequence[str]) -> float:
        with self.seen.lock:
            return max(self.seen.answers[i][0] for i in ids)

    def answered_between(self, ids: Sequence[str], start: float, end: float) -> int:
        with self.seen.lock:
            return sum(1 for i in ids if start <= self.seen.answers[i][0] <= end)


def run_arm(bootstrap: str, token_s: float, fair: bool, plan: str, args: Any) -> dict[str, Any]:
    arm = Arm(bootstrap, token_s, fair)
    stop = threading.Event()
    reader = threading.Thread(target=read_answers, args=(arm.config, arm.seen, stop), daemon=True)
    reader.start()
    try:
        with running_worker(arm.config):
            wait_for(arm.seen, arm.submit("warm", 1), 120)
            if plan == "concurrent":
                return _concurrent(arm, args.large // 4)
            if plan == "small":
                ids = arm.submit("small", SMALL)
                wait_for(arm.seen, ids, 120)
                return {"seconds": round(arm.done_at(ids) - arm.submitted["small"], 3)}
            large = arm.submit("large", args.large)
            smalls: list[tuple[str, list[str]]] = []
            if plan == "mixed":
                for k in range(SMALL_BATCHES):
                    time.sleep(args.every)
                    smalls.append((f"small{k}", arm.submit(f"small{k}", SMALL)))
            wait_for(arm.seen, large, 1800)
            for _, ids in smalls:
                wait_for(arm.seen, ids, 600)
            seconds = arm.done_at(large) - arm.submitted["large"]
            row: dict[str, Any] = {
                "large_seconds": round(seconds, 2),
                "large_requests_per_s": round(args.large / seconds, 1),
            }
            if plan == "mixed":
                row["small"] = [_small(arm, name, ids) for name, ids in smalls]
            return row
    finally:
        stop.set()
        reader.join(10)


def _small(arm: Arm, name: str, ids: list[str]) -> dict[str, Any]:
    return {"seconds": round(arm.done_at(ids) - arm.submitted[name], 3)}


def _concurrent(arm: Arm, each: int) -> dict[str, Any]:
    batches: list[list[str]] = [[] for _ in range(4)]

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
    return {
        "window_s": round(end - start, 2),
        "answered_in_window": shares,
        "jain": round(jain(shares), 3) if end > start else 0.25,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=20_000)
    parser.add_argument("--token-s", type=float, default=0.005)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between small batches")
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        b, t = broker.bootstrap, args.token_s
        alone_fifo = run_arm(b, t, False, "alone", args)
        alone_fair = run_arm(b, t, True, "alone", args)
        small_alone = run_arm(b, t, True, "small", args)["seconds"]
        mixed = {mode: run_arm(b, t, mode == "fair", "mixed", args) for mode in ("fifo", "fair")}
        concurrent = {
            mode: run_arm(b, t, mode == "fair", "concurrent", args) for mode in ("fifo", "fair")
        }
    for row in mixed.values():
        for small in row["small"]:
            small["slowdown"] = round(small["seconds"] / small_alone, 2)
    payload = {
        "setup": {
            "large": args.large,
            "small": SMALL,
            "small_batches": SMALL_BATCHES,
            "every_s": args.every,
            "token_s": t,
            "max_tokens": 4,
            "workers": 1,
        },
        "alone": {"fifo": alone_fifo, "fair": alone_fair},
        "single_batch_throughput_fair_vs_fifo": round(
            alone_fair["large_requests_per_s"] / alone_fifo["large_requests_per_s"], 3
        ),
        "small_alone_seconds": small_alone,
        "mixed": mixed,
        "concurrent": concurrent,
        "fifo_jain": concurrent["fifo"]["jain"],
        "fair_jain": concurrent["fair"]["jain"],
    }
    for mode, row in mixed.items():
        slowdowns = sorted(s["slowdown"] for s in row["small"])
        payload[f"{mode}_small_slowdown_median"] = slowdowns[len(slowdowns) // 2]
        payload[f"{mode}_small_slowdown_max"] = slowdowns[-1]
    write_result("fairness", payload)
    print(payload)
    return payload


if __name__ == "__main__":
    main()
