"""Batching against real time: the same summarisation requests through each CPU engine.

Three ways to serve the same N requests (:func:`bench.wire.summary_requests`), all present
at the start, as in an offline batch job, for each engine that runs on CPU here — ``hf``
(static batches) and ``vllm`` (in flight):

* (a) ``one at a time``: the engine called directly with one request per call, as a
  real-time service runs them; no Kafka (which only flatters it);
* (b) ``batchpipe``: the full worker on the embedded broker — decode, dynamic batcher
  (max_batch_size 32, timeout 100 ms, adaptive off so the batcher alone is measured),
  engine stage (static for hf, in flight for vllm), encode, produce, commit — read back by
  a consumer;
* (c) ``engine direct``: the engine fed without Kafka the way it runs best — hf with
  pre-formed batches of 32 sorted by prompt length (least padding), vllm with every
  request submitted at once to its own scheduler (32 sequences at a time): the ceiling
  for (b).

For hf, (a) and (c) run interleaved, one batch's worth at a time, so that load from other
processes hits both alike; vllm's (c) is one run of everything (slicing it into waves
would make it static batching), then its (a). Every request generates exactly
``max_tokens`` tokens (greedy, EOS suppressed), so every mode does the same work. Latency
is reported two ways: end to end (from the moment the job was submitted until the
request's answer — for (b) until the reader received it), and service (from the moment
the engine started the request's batch until it finished: what a lone real-time caller
waits; for vllm's (c), where nothing marks a request's start, from submission).

The default CPU engine (``engine.kind``'s default, ``make demo``, the CPU image) is the
engine whose (b) serves these requests fastest; ``default_engine`` records the choice and
the top-level figures are that engine's.

    .venv/bin/python -m bench.realtime [--requests N] [--max-tokens T] [--engines hf,vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from msgspec import structs

from bench.common import fresh_config, worker_thread, write_result
from bench.inflight import Borrowed, OneBatchAtATime
from bench.wire import ResultReader, percentile, prompt_fetch, summary_requests, timestamped
from tests.integration.harness import publish
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import (
    Completion,
    Engine,
    EngineInput,
    ResolvedSampling,
    StaticEngine,
)
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.model import load_pretrained, resolve_dtype
from worker.engines.models import locate_model
from worker.engines.vllm.engine import VllmEngine
from worker.kafka.broker import EmbeddedBroker
from worker.known_models import DEFAULT_MODEL
from worker.wire.messages import InferenceRequest

N = 256
MAX_TOKENS = 16
BATCH = 32
ENGINES = ("hf", "vllm")
BATCHING = BatchingConfig(max_batch_size=BATCH, prefetch_count=2 * BATCH, adaptive=False)


@dataclass
class Served:
    """How one mode served the requests: its wall time and each request's latencies."""

    seconds: float = 0.0
    e2e_s: list[float] = field(default_factory=list)
    service_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0

    def run(self, engine: StaticEngine, inputs: Sequence[EngineInput], size: int) -> None:
        """Run ``inputs`` in consecutive batches of ``size``, after what ran before.

        End-to-end latency counts from the start of this mode's first run, so a mode run
        in several slices adds up as if it had run in one go.
        """
        start = time.monotonic()
        for first in range(0, len(inputs), size):
            engine.run_batch(inputs[first : first + size], self._recorder(start))
        self.seconds += time.monotonic() - start

    def _recorder(self, start: float) -> Callable[[Completion], None]:
        batch_start = time.monotonic()

        def finished(c: Completion) -> None:
            assert c.error is None, c.error
            end = time.monotonic()
            self.e2e_s.append(self.seconds + end - start)
            self.service_s.append(end - batch_start)
            self.completion_tokens += c.completion_tokens

        return finished

    def figures(self) -> dict[str, Any]:
        def ms(values: Sequence[float], q: float) -> float:
            return round(percentile(values, q) * 1000, 1)

        return {
            "seconds": round(self.seconds, 2),
            "requests_per_s": round(len(self.e2e_s) / self.seconds, 3),
            "tokens_per_s": round(self.completion_tokens / self.seconds, 1),
            "e2e_p50_ms": ms(self.e2e_s, 50),
            "e2e_p99_ms": ms(self.e2e_s, 99),
            "service_p50_ms": ms(self.service_s, 50),
            "service_p99_ms": ms(self.service_s, 99),
        }


def _inputs(engine: Engine, requests: Sequence[InferenceRequest]) -> list[EngineInput]:
    return [
        EngineInput(
            r.custom_id,
            engine.encode(r),
            ResolvedSampling.resolve(r.sampling, r.enable_thinking, GenerationConfig()),
        )
        for r in requests
    ]


def hf_direct(engine: HFEngine, inputs: Sequence[EngineInput]) -> tuple[Served, Served]:
    """(a) and (c) on hf, interleaved by slices of one batch so background load hits both
    alike. Inputs sorted by prompt length form the ideal batches; each batch's requests then
    run once more one at a time."""
    alone, ideal = Served(), Served()
    by_length = sorted(inputs, key=lambda i: len(i.prompt_token_ids))
    for first in range(0, len(by_length), BATCH):
        chunk = by_length[first : first + BATCH]
        ideal.run(engine, chunk, BATCH)
        alone.run(engine, chunk, 1)
    return alone, ideal


def vllm_direct(engine: VllmEngine, inputs: Sequence[EngineInput]) -> tuple[Served, Served]:
    """(a) and (c) on vllm: everything in flight at once, then each request alone."""
    alone, direct = Served(), Served()
    one_batch = OneBatchAtATime(engine)  # submits a whole "batch", collects as each ends
    direct.run(one_batch, inputs, len(inputs))
    alone.run(one_batch, inputs, 1)
    return alone, direct


def through_worker(
    engine: Engine, kind: str, requests: Sequence[InferenceRequest]
) -> tuple[Served, float]:
    """The requests through a worker on the embedded broker, and its decode µs per request.

    Returns when a consumer has read every answer. The decode stage includes the
    tokenizer (chat template), so it is the real per-request CPU cost before the engine.
    """
    with EmbeddedBroker() as broker:
        config = replace(
            fresh_config(broker.bootstrap, **vars(BATCHING)),
            engine=EngineConfig(kind=kind, device="cpu"),  # type: ignore[arg-type]
        )
        config = prompt_fetch(config)
        reader = ResultReader(config)
        with worker_thread(config, engine) as worker:
            warm = [structs.replace(r, custom_id=f"warm-{r.custom_id}") for r in requests[:2]]
            publish(config, warm)  # group joins and the first generate() stay out
            reader.wait_for([r.custom_id for r in warm], timeout_s=300)
            t0 = time.time()
            stamped = [timestamped(r) for r in requests]
            publish(config, stamped)
            reader.wait_for([r.custom_id for r in requests], timeout_s=1800)
            registry = worker.metrics.registry
            decode_s = registry.get_sample_value(
                "batchpipe_stage_seconds_total", {"stage": "decode"}
            )
        reader.close()
    answers = [(r.submitted_at or t0, *reader.arrived[r.custom_id]) for r in stamped]
    assert all(res.status == "completed" for *_, res in answers)
    served = Served(
        max(arrived for _, arrived, _ in answers) - t0,
        [arrived - submitted for submitted, arrived, _ in answers],
        [res.timings.engine_s for *_, res in answers],
        sum(res.usage.completion_tokens for *_, res in answers),
    )
    return served, (decode_s or 0.0) / (len(requests) + len(warm)) * 1e6


def measure(kind: str, requests: Sequence[InferenceRequest]) -> dict[str, Any]:
    """(a), (b) and (c) on one engine."""
    started = time.monotonic()
    worker_engine: Engine
    with ExitStack() as owned:
        if kind == "hf":
            cpu = torch.device("cpu")
            model = load_pretrained(locate_model(DEFAULT_MODEL), cpu, resolve_dtype("auto", cpu))
            config = EngineConfig(kind="hf", device="cpu")
            hf = HFEngine(config, batching=BATCHING, ignore_eos=True, preloaded=model)
            hf.load()
            inputs = _inputs(hf, requests)
            hf.run_batch(inputs[:2], lambda c: None)  # warm-up: first-call allocations
            load_s = time.monotonic() - started
            alone, direct = hf_direct(hf, inputs)
            worker_engine = HFEngine(config, BATCHING, ignore_eos=True, preloaded=model)
        else:
            vllm = VllmEngine(EngineConfig(kind="vllm", device="cpu"), BATCHING, ignore_eos=True)
            vllm.load()
            owned.callback(vllm.close)
            inputs = _inputs(vllm, requests)
            OneBatchAtATime(vllm).run_batch(inputs[:2], lambda c: None)  # warm-up
            load_s = time.monotonic() - started
            alone, direct = vllm_direct(vllm, inputs)
            worker_engine = Borrowed(vllm)
        print(kind, "a", alone.figures(), "\nc", direct.figures(), flush=True)
        batched, decode_us = through_worker(worker_engine, kind, requests)
    print(kind, "b", batched.figures(), flush=True)
    prompt_tokens = [len(i.prompt_token_ids) for i in inputs]
    direct_name = f"ideal batches of {BATCH}" if kind == "hf" else "all in flight at once"
    return {
        "engine": kind,
        "feeding": "static" if kind == "hf" else "in flight",
        "load_seconds": round(load_s, 1),
        "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens), 1),
        "modes": {
            "a": {"name": "one at a time (real-time service)", **alone.figures()},
            "b": {"name": "batchpipe worker (dynamic batcher, Kafka)", **batched.figures()},
            "c": {"name": f"engine direct, {direct_name} (no Kafka)", **direct.figures()},
        },
        "worker_decode_us_per_request": round(decode_us, 1),
        "throughput_ratio_b_over_a": round(alone.seconds / batched.seconds, 2),
        "throughput_ratio_b_over_c": round(direct.seconds / batched.seconds, 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=N)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    args = parser.parse_args(argv)
    requests = summary_requests(args.requests, args.max_tokens)
    load_before = os.getloadavg()
    engines = {kind: measure(kind, requests) for kind in args.engines.split(",")}
    fastest = max(engines, key=lambda k: engines[k]["modes"]["b"]["requests_per_s"])
    figures = {
        "model": DEFAULT_MODEL,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "decoding": "greedy, EOS suppressed: every request generates exactly max_tokens",
        "note": f"N={args.requests}, not 1,000: one request alone takes up to a second here, "
        "so 1,000 would take over 15 minutes in (a) alone; the same N runs in a, b and c",
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "default_engine": fastest,
        "default_engine_rule": "the engine whose worker (b) serves the requests fastest",
        **(
            {"default_over_other_b": _ratio_over_others(engines, fastest)}
            if len(engines) > 1
            else {}
        ),
        **engines[fastest],
        "engines": engines,
        "source_document_b_over_a": 3.8,
    }
    path = write_result("realtime", figures)
    print(path, json.dumps(figures, indent=1))
    return figures


def _ratio_over_others(engines: dict[str, dict[str, Any]], fastest: str) -> dict[str, float]:
    best = engines[fastest]["modes"]["b"]["requests_per_s"]
    return {
        kind: round(best / e["modes"]["b"]["requests_per_s"], 2)
        for kind, e in engines.items()
        if kind != fastest
    }


if __name__ == "__main__":
    main()
