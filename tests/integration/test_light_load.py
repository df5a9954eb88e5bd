"""Light load (issue 29): under a steady trickle far below capacity, a request leaves the
batcher at ``timeout_ms`` and its answer is visible about one batch and one commit later.

The bounds are the issue's goals with generous slack (these machines are noisy, and a
test makes no timing assertion tighter than that); ``bench/latency.py`` measures the
figures themselves. Before the fix the same trickle measured P99 ``batch_wait_s`` 2,031 ms
and end to end 2,566 ms (the lag probe's broker queries inside the loop, 500 ms fetch waits).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from bench.latency import MAX_TOKENS, Offered, Seen, read_answers, wait_for
from tests.integration.harness import running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients

pytestmark = pytest.mark.integration

SLACK = 2.0  # × the goal


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_a_trickle_is_released_at_timeout_ms_and_answered_a_batch_later(
    kafka_config: Config,
) -> None:
    config = replace(
        kafka_config,
        kafka=replace(kafka_config.kafka, partitions=6),
        engine=EngineConfig(kind="echo", simulated_token_s=0.01),  # ~40 ms a batch
        generation=replace(kafka_config.generation, max_tokens=MAX_TOKENS),
    )
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    seen, stop = Seen({}, threading.Lock()), threading.Event()
    reading = threading.Thread(target=read_answers, args=(config, seen, stop), daemon=True)
    reading.start()
    offered = Offered(config)
    try:
        with running_worker(config):
            wait_for(seen, offered.publish("warm", 1, None), 120)
            ids = offered.publish("trickle", 100, rate=20.0)
            wait_for(seen, ids, 60)
    finally:
        stop.set()
        reading.join(10)
    with seen.lock:
        answers = [seen.answers[i] for i in ids]
    batch_wait = p99([t.batch_wait_s for _, t in answers])
    engine = sorted(t.engine_s for _, t in answers)[len(answers) // 2]
    end_to_end = p99([at - offered.sent[i] for i, (at, _) in zip(ids, answers, strict=True)])
    timeout_s, commit_s = config.batching.timeout_ms / 1000, k.commit_interval_ms / 1000
    assert batch_wait <= SLACK * (timeout_s + 0.020), f"P99 batch wait {batch_wait:.3f} s"
    goal = timeout_s + 1.2 * engine + commit_s + 0.050
    assert end_to_end <= SLACK * goal, f"P99 end to end {end_to_end:.3f} s, goal {goal:.3f} s"
