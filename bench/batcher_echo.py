"""Batch formation on a real broker: 2,000 requests through the worker with the echo engine.

Reports the mean batch size and mean batch fill (tokens / ``max_batch_tokens``) reached,
the peak number of requests in flight against ``prefetch_count``, and the process's
resident memory sampled while the topic still holds the backlog (flat = backpressure).

    .venv/bin/python -m bench.batcher_echo
"""

from __future__ import annotations

import os
import random
import threading
import time

from bench.common import fresh_config, worker_thread, write_result
from tests.integration.harness import publish, read_results
from worker.engines.echo import EchoEngine
from worker.kafka.broker import EmbeddedBroker
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

N = 2000
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "batches",
    "fill",
    "up",
]


def requests(rng: random.Random) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            messages=(ChatMessage("user", " ".join(rng.choices(WORDS, k=rng.randint(5, 60)))),),
            sampling=SamplingParams(max_tokens=rng.choice([32, 64, 128]), temperature=0.0),
        )
        for i in range(N)
    ]


def run(broker: EmbeddedBroker, adaptive: bool) -> dict[str, object]:
    """One 2,000-request run; the same seeded workload for every configuration."""
    config = fresh_config(
        broker.bootstrap,
        prefetch_count=64,
        max_batch_size=32,
        max_batch_tokens=8192,
        adaptive=adaptive,
    )
    publish(config, requests(random.Random(7)))
    # per-batch and per-token delays make batching pay off, as it does on a real model
    engine = EchoEngine(delay_per_batch_s=0.005, delay_per_token_s=0.00001)
    started = time.monotonic()
    rss: list[float] = []
    done = threading.Event()

    def sample() -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not done.wait(0.25):
            with open("/proc/self/statm") as statm:
                rss.append(int(statm.read().split()[1]) * page / 2**20)

    sampler = threading.Thread(target=sample, daemon=True)
    with worker_thread(config, engine) as worker:
        sampler.start()
        read_results(config, N, timeout_s=600)
        elapsed = time.monotonic() - started
        done.set()
        snap = worker.metrics.snapshot()
        peak = worker.admission.peak
    return {
        "adaptive": adaptive,
        "batches": snap.batches,
        "mean_batch_size": round(snap.mean_batch_size, 2),
        "mean_batch_fill": round(snap.mean_token_fill_ratio, 3),
        "peak_in_flight": peak,
        "requests_per_s": round(N / elapsed, 1),
        # resident MiB over the run, after the first fifth (imports, client buffers warm up)
        "rss_mib_min_max": [round(min(rss[len(rss) // 5 :]), 1), round(max(rss), 1)],
    }


def main() -> None:
    with EmbeddedBroker() as broker:
        runs = [run(broker, adaptive=False), run(broker, adaptive=True)]
    figures = {
        "requests": N,
        "prefetch_count": 64,
        "max_batch_size": 32,
        "max_batch_tokens": 8192,
        "engine": "echo, 5 ms per batch + 10 us per token",
        "runs": runs,
    }
    path = write_result("batcher_echo", figures)
    print(path, figures)


if __name__ == "__main__":
    main()
