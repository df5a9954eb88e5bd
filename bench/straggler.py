"""Answers behind one long request: how long until a backlog's answers are all visible.

One requests partition, the echo engine fed in flight at ``--step-s`` a decoding step. Two
arms in one run, each on a fresh worker and topics of its own: a backlog of ``--count``
short requests (8 tokens) alone, and the same backlog behind one request that decodes for
``--long-s`` seconds (published first, so it runs ahead of all of them in the partition).
A reader assigned to the results topic (read_committed, as ``collect`` reads) notes when
each answer becomes visible. Reported per arm: seconds from the first publish until every
short answer is visible, the P50/P99 of each short answer's visibility after its publish,
and the ratio of the two arms (issue 48's goal: ≤ 1.2; held until an offset passed them,
the short answers waited for the long one: 102.4 s against 53.1 s, 1.93×).

    python -m bench.straggler [--count 20000] [--long-s 60]

Run alone (it takes about four minutes): ``flock /tmp/heavy.lock python -m bench.straggler``.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import replace
from typing import Any

from bench.common import fresh_config, write_result
from bench.latency import Offered, Seen, read_answers, wait_for
from tests.integration.harness import running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker


def _config(bootstrap: str, step_s: float) -> Config:
    config = fresh_config(bootstrap, max_batch_tokens=4 * 8192)
    return replace(
        config,
        kafka=replace(config.kafka, partitions=1),
        engine=EngineConfig(kind="echo", echo_mode="in_flight", simulated_token_s=step_s),
        generation=replace(config.generation, max_tokens=8),
        worker=replace(config.worker, drain_timeout_s=1.0),
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def arm(bootstrap: str, count: int, long_s: float, step_s: float) -> dict[str, Any]:
    """One arm: ``count`` short requests, behind one of ``long_s`` seconds when > 0."""
    config = _config(bootstrap, step_s)
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    seen, stop = Seen({}, threading.Lock()), threading.Event()
    reading = threading.Thread(target=read_answers, args=(config, seen, stop), daemon=True)
    reading.start()
    offered = Offered(config)
    try:
        with running_worker(config):
            wait_for(seen, offered.publish("warm", 1, None), 120)
            start = time.time()
            if long_s > 0:
                offered.publish_long("long", round(long_s / step_s))
            ids = offered.publish("short", count, None)
            wait_for(seen, ids, 600)
            with seen.lock:
                visible = [seen.answers[i][0] for i in ids]
                long_done = "long" in seen.answers
    finally:
        stop.set()
        reading.join(10)
    after = [at - offered.sent[i] for i, at in zip(ids, visible, strict=True)]
    return {
        "long_s": long_s,
        "count": count,
        "all_visible_s": round(max(visible) - start, 2),
        "p50_s": round(_quantile(after, 0.5), 3),
        "p99_s": round(_quantile(after, 0.99), 3),
        "long_answered_before_the_last_short": long_done,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="short requests")
    parser.add_argument("--long-s", type=float, default=60.0, help="the long request's time")
    parser.add_argument("--step-s", type=float, default=0.01, help="a decoding step")
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        alone = arm(broker.bootstrap, args.count, 0.0, args.step_s)
        behind = arm(broker.bootstrap, args.count, args.long_s, args.step_s)
    payload = {
        "arms": [alone, behind],
        "ratio_all_visible": round(behind["all_visible_s"] / alone["all_visible_s"], 3),
        "goal_ratio": 1.2,
        "command": "python -m bench.straggler",
    }
    print(payload)
    write_result("straggler", payload)
    return payload


if __name__ == "__main__":
    main()
