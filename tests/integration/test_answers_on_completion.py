"""An answer is visible to a read_committed reader about one commit after it completes,
whatever still runs ahead of it in its partition (issue 48, docs/architecture.md §2
"Answers on completion").

One partition, the echo engine fed in flight at 10 ms a decoding step: short requests
(8 tokens) at a light steady rate, first alone, then behind one request that decodes for
60 s. Held until an offset passed them (before issue 48) the short answers behind it were
read P99 59.2 s after they were sent, against 0.3 s alone; the goal is the P99 behind it
within twice the P99 alone plus a second. Figures: ``python -m bench.latency --mixed``.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from bench.latency import Offered, Seen, read_answers, wait_for
from tests.integration.harness import running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients

pytestmark = pytest.mark.integration

STEP_S = 0.01
LONG_TOKENS = 6_000  # 60 s of decoding steps
SHORTS = 120
RATE = 10.0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_short_answers_behind_a_60_s_request_are_visible_as_they_complete(
    kafka_config: Config,
) -> None:
    config = replace(
        kafka_config,
        kafka=replace(kafka_config.kafka, partitions=1),
        engine=EngineConfig(kind="echo", echo_mode="in_flight", simulated_token_s=STEP_S),
        batching=replace(kafka_config.batching, max_batch_tokens=4 * 8192),
        generation=replace(kafka_config.generation, max_tokens=8),
        worker=replace(kafka_config.worker, drain_timeout_s=1.0),
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
            alone = offered.publish("alone", SHORTS, rate=RATE)
            wait_for(seen, alone, 60)
            long = offered.publish_long("long", LONG_TOKENS)
            behind = offered.publish("behind", SHORTS, rate=RATE)
            wait_for(seen, behind, 60)
            with seen.lock:
                assert long not in seen.answers  # still decoding: everything passed it
    finally:
        stop.set()
        reading.join(10)

    def latency(ids: list[str]) -> float:
        with seen.lock:
            return p99([seen.answers[i][0] - offered.sent[i] for i in ids])

    before, after = latency(alone), latency(behind)
    assert after <= 2 * before + 1.0, f"P99 {after:.2f} s behind the long one, {before:.2f} alone"
