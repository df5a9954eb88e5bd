"""Adaptive against fixed batch size, under a steady and a bursty arrival pattern.

The worker runs the echo engine with a simulated cost, so the figure takes seconds, not
hours: every batch takes ``DELAY_PER_BATCH_S`` plus ``DELAY_PER_TOKEN_S`` per generated
token of its longest answer, whatever its size — a GPU-like engine whose batch costs
about the same as one request, so batching matters. Every answer is ``MAX_TOKENS`` long,
so a batch takes 26 ms: at most 38 requests/s at size 1, 300 at size 8, 1,200 at 32.

Requests arrive open-loop at ``RATE`` per second on average for ``DURATION_S`` seconds:
``steady`` spaces them evenly; ``bursty`` sends each second's worth at once. Each
configuration — fixed ``max_batch_size`` 1, 8, 32, and the adaptive controller
(``batching.adaptive``, starting at and capped by 32, sampled every second) — gets a fresh
worker and topics on one broker. ``prefetch_count`` is raised above the number of
requests so that Kafka backpressure never engages and only batching differs, and
consumers fetch every 20 ms (:func:`bench.wire.prompt_fetch`, the embedded broker's quirk).
Throughput is answers over the time from the first submission to the last answer;
latency is from submission until a consumer read the answer.

    .venv/bin/python -m bench.adaptive
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from msgspec import structs

from bench.common import fresh_config, worker_thread, write_result
from bench.wire import ResultReader, percentile, prompt_fetch, summary_requests, timestamped
from tests.integration.harness import publish
from worker.config import Config, EngineConfig
from worker.engines.echo import EchoEngine
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.wire.codec import encode_request
from worker.wire.messages import InferenceRequest

DELAY_PER_BATCH_S = 0.010
DELAY_PER_TOKEN_S = 0.0005
MAX_TOKENS = 32
RATE = 240
DURATION_S = 3.0
BURST_EVERY_S = 1.0
CONFIGS = (("fixed 1", 1, False), ("fixed 8", 8, False), ("fixed 32", 32, False))
ADAPTIVE = ("adaptive (max 32)", 32, True)
PATTERNS = ("steady", "bursty")


def arrivals(pattern: str, count: int) -> list[float]:
    """Send times (seconds from the start) of ``count`` requests at ``RATE`` on average."""
    if pattern == "steady":
        return [i / RATE for i in range(count)]
    per_burst = round(RATE * BURST_EVERY_S)
    return [(i // per_burst) * BURST_EVERY_S for i in range(count)]


def send_on_schedule(
    config: Config, requests: Sequence[InferenceRequest], offsets: Sequence[float]
) -> dict[str, float]:
    """Publish each request at its offset; returns each one's submission (unix) time."""
    producer = clients.producer(config.kafka)
    submitted: dict[str, float] = {}
    start = time.monotonic()
    for request, offset in zip(requests, offsets, strict=True):
        wait = start + offset - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        stamped = timestamped(request)
        value, headers = encode_request(stamped)
        sent: list[tuple[str, str | bytes | None]] = list(headers)
        producer.produce(config.kafka.requests_topic, value=value, headers=sent)
        producer.poll(0)
        submitted[request.custom_id] = stamped.submitted_at or time.time()
    producer.flush(30)
    return submitted


def run(broker: str, pattern: str, name: str, size: int, adaptive: bool, n: int) -> dict[str, Any]:
    config = fresh_config(
        broker,
        max_batch_size=size,
        adaptive=adaptive,
        prefetch_count=2 * n,
        max_batch_tokens=4 * 8192,  # echo counts bytes as tokens
    )
    config = prompt_fetch(replace(config, engine=EngineConfig(kind="echo")))
    requests = summary_requests(n, MAX_TOKENS)
    engine = EchoEngine(delay_per_batch_s=DELAY_PER_BATCH_S, delay_per_token_s=DELAY_PER_TOKEN_S)
    reader = ResultReader(config)
    with worker_thread(config, engine) as worker:
        warm = structs.replace(requests[0], custom_id="warm-up")
        publish(config, [warm])  # group joins stay out of the figures
        reader.wait_for([warm.custom_id], timeout_s=120)
        submitted: dict[str, float] = {}
        sender = threading.Thread(
            target=lambda: submitted.update(
                send_on_schedule(config, requests, arrivals(pattern, n))
            )
        )
        sender.start()  # the reader stamps arrivals meanwhile
        reader.wait_for([r.custom_id for r in requests], timeout_s=600)
        sender.join()
        snap = worker.metrics.snapshot()
        final_size = worker.batcher.max_batch_size
    reader.close()
    arrived = {i: reader.arrived[i][0] for i in submitted}
    timings = [reader.arrived[i][1].timings for i in submitted]
    latencies = [arrived[i] - submitted[i] for i in submitted]
    seconds = max(arrived.values()) - min(submitted.values())
    row = {
        "pattern": pattern,
        "config": name,
        "requests": n,
        "requests_per_s": round(n / seconds, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "mean_queued_ms": round(sum(t.queued_s for t in timings) / n * 1000, 1),
        "mean_batch_wait_ms": round(sum(t.batch_wait_s for t in timings) / n * 1000, 1),
        "mean_engine_ms": round(sum(t.engine_s for t in timings) / n * 1000, 1),
        "mean_batch_size": round(snap.mean_batch_size, 1),
        "final_max_batch_size": final_size,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> dict[str, Any]:
    n = round(RATE * DURATION_S)
    with EmbeddedBroker() as broker:
        rows = [
            run(broker.bootstrap, pattern, *config, n)
            for pattern in PATTERNS
            for config in (*CONFIGS, ADAPTIVE)
        ]
    figures = {
        "engine": f"echo, {DELAY_PER_BATCH_S * 1000:g} ms per batch + "
        f"{DELAY_PER_TOKEN_S * 1000:g} ms per token of the longest answer (simulated)",
        "max_tokens": MAX_TOKENS,
        "arrival_rate_per_s": RATE,
        "duration_s": DURATION_S,
        "bursty": f"{round(RATE * BURST_EVERY_S)} requests at once every {BURST_EVERY_S:g} s",
        "timeout_ms": 100,
        "adaptive_interval_ms": 1000,
        "runs": rows,
    }
    path = write_result("adaptive", figures)
    print(path)
    return figures


if __name__ == "__main__":
    main()
