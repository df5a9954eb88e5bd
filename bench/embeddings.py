"""Embeddings batched against one at a time: the same texts through each embedding engine.

N ``/v1/embeddings`` requests of one text each (5–60 words, seeded), all present at the
start as in an offline batch job, embedded with all-MiniLM-L6-v2 on the CPU by each
embedding engine — ``vllm`` (vLLM's pooling runner) and ``hf`` (transformers) — three ways:

* ``one at a time``: the engine called directly with one request per call, as a
  real-time embedding service runs them; no Kafka;
* ``batched, direct``: the engine fed batches of ``BATCH`` requests, no Kafka: the
  ceiling for the worker;
* ``batchpipe``: the full worker on the embedded broker (decode, tokenizer, the dynamic
  batcher by tokens with ``max_tokens`` 0, the engine, encode, produce, commit), read back
  by a consumer; ``max_batch_size`` ``BATCH``, adaptive off.

The first two run interleaved, one batch's worth at a time, so that load from other
processes hits both alike. Embeddings/s counts input texts over wall time; the ratios
are batched (direct, and through the worker) over one at a time, per engine.

    .venv/bin/python -m bench.embeddings [--requests N] [--engines vllm,hf]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from msgspec import structs

from bench.common import fresh_config, worker_thread, write_result
from bench.wire import ResultReader
from tests.integration.harness import publish
from worker.config import BatchingConfig, EngineConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.embed.base import EmbeddingEngine
from worker.engines.factory import create_engine
from worker.kafka.broker import EmbeddedBroker
from worker.known_models import EMBEDDING_MODEL
from worker.wire.messages import InferenceRequest

N = 512
BATCH = 32
ENGINES = ("vllm", "hf")
BATCHING = BatchingConfig(max_batch_size=BATCH, prefetch_count=2 * BATCH, adaptive=False)
WORDS = (
    "river", "stone", "light", "garden", "window", "morning", "quiet", "market", "letter",
    "bridge", "winter", "story", "paper", "music", "harbor", "forest", "lantern", "thunder",
    "orchard", "candle", "valley", "engine", "signal", "silver", "meadow",
)  # fmt: skip


def workload(n: int, seed: int = 17) -> list[InferenceRequest]:
    """``n`` embeddings requests of one text of 5–60 words each."""
    rng = random.Random(seed)
    return [
        InferenceRequest(
            custom_id=f"e{i}",
            model=EMBEDDING_MODEL,
            embedding_inputs=(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))),),
        )
        for i in range(n)
    ]


def engine_config(kind: str) -> EngineConfig:
    return EngineConfig(kind=kind, model=EMBEDDING_MODEL, task="embed", device="cpu")  # type: ignore[arg-type]


def inputs_of(engine: EmbeddingEngine, requests: Sequence[InferenceRequest]) -> list[EngineInput]:
    sampling = ResolvedSampling.prompt_only()
    found = []
    for r in requests:
        segments = engine.encode_inputs(r)
        ids = tuple(t for segment in segments for t in segment)
        found.append(EngineInput(r.custom_id, ids, sampling, segments))
    return found


def direct(engine: EmbeddingEngine, inputs: Sequence[EngineInput]) -> dict[str, float]:
    """Seconds of each direct mode, interleaved one batch's worth at a time."""
    seconds = {"one_at_a_time": 0.0, "batched_direct": 0.0}
    done: list[Completion] = []
    for first in range(0, len(inputs), BATCH):
        chunk = inputs[first : first + BATCH]
        start = time.monotonic()
        for item in chunk:
            engine.run_batch([item], done.append)
        seconds["one_at_a_time"] += time.monotonic() - start
        start = time.monotonic()
        engine.run_batch(chunk, done.append)
        seconds["batched_direct"] += time.monotonic() - start
    assert len(done) == 2 * len(inputs) and all(c.error is None for c in done)
    return seconds


def through_worker(kind: str, requests: Sequence[InferenceRequest]) -> dict[str, float]:
    """Seconds until a consumer has read every answer, and the batches the worker formed."""
    with EmbeddedBroker() as broker:
        config = replace(
            fresh_config(broker.bootstrap, **vars(BATCHING)), engine=engine_config(kind)
        )
        reader = ResultReader(config)
        with worker_thread(config):
            warm = [structs.replace(r, custom_id=f"warm-{r.custom_id}") for r in requests[:2]]
            publish(config, warm)  # the group join and the model load stay out
            reader.wait_for([r.custom_id for r in warm], timeout_s=600)
            start = time.time()
            publish(config, requests)
            reader.wait_for([r.custom_id for r in requests], timeout_s=1800)
        reader.close()
    answers = [reader.arrived[r.custom_id] for r in requests]
    assert all(res.status == "completed" and len(res.embeddings) == 1 for _, res in answers)
    return {
        "seconds": max(arrived for arrived, _ in answers) - start,
        "mean_batch_size": sum(res.batch_size for _, res in answers) / len(answers),
    }


def run(kind: str, requests: Sequence[InferenceRequest]) -> dict[str, Any]:
    engine = create_engine(engine_config(kind), BATCHING)
    assert isinstance(engine, EmbeddingEngine)
    engine.load()
    try:
        inputs = inputs_of(engine, requests)
        engine.run_batch(inputs[:BATCH], lambda _: None)  # warm-up, not counted
        seconds = direct(engine, inputs)
    finally:
        engine.close()
    worker = through_worker(kind, requests)
    n = len(requests)

    def rate(s: float) -> float:
        return round(n / s, 1)

    modes = {
        "one_at_a_time": {"embeddings_per_s": rate(seconds["one_at_a_time"])},
        "batched_direct": {"embeddings_per_s": rate(seconds["batched_direct"])},
        "batchpipe": {
            "embeddings_per_s": rate(worker["seconds"]),
            "mean_batch_size": round(worker["mean_batch_size"], 1),
        },
    }
    one = modes["one_at_a_time"]["embeddings_per_s"]
    return {
        "modes": modes,
        "batched_direct_vs_one": round(modes["batched_direct"]["embeddings_per_s"] / one, 2),
        "batchpipe_vs_one": round(modes["batchpipe"]["embeddings_per_s"] / one, 2),
        "prompt_tokens": sum(len(i.prompt_token_ids) for i in inputs),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=N)
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args(argv)
    requests = workload(args.requests)
    engines = {kind: run(kind, requests) for kind in args.engines.split(",")}
    path = write_result(
        "embeddings",
        {
            "model": EMBEDDING_MODEL,
            "requests": len(requests),
            "workload": "one text of 5-60 words per request",
            "batch_size": BATCH,
            "engines": engines,
        },
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
