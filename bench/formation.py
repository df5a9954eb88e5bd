"""Batch formation that wastes nothing: FIFO vs length-aware vs length-aware + shared prefix.

A mixed workload — prompt lengths 10–600 tokens, half of the requests starting with one
300-token system prompt, ``max_tokens`` 16–64 — is driven through the batcher and the hf
engine directly (``DynamicBatcher`` + ``HFEngine``, no Kafka: broker noise stays out).
Every request arrives at t=0, as in an offline batch job; latency is completion time minus
arrival, and each request completes as soon as its row ends. Greedy, EOS suppressed, so
every request generates exactly its ``max_tokens`` and every configuration does the same
useful work. Three configurations:

* ``fifo``: ``length_aware=False, shared_prefix=False`` (and no prefix cache);
* ``length_aware``: length bucketing around each batch's oldest request;
* ``length_aware+shared_prefix``: also prefix grouping, and the engine's prefix KV cache.

This machine is shared, so the configurations run interleaved, one batch each in turn, and
each keeps a clock of its own (the wall time of its own batches): a burst of load elsewhere
hits all three alike. Process CPU seconds are reported beside wall seconds.

    python -m bench.formation            # 192 requests: bench/results/formation.{json,png}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

from batcher import BatchLimits, DynamicBatcher, Pending
from batcher.formation import prefix_key_of
from bench.common import RESULTS, write_result
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.model import load_pretrained, resolve_dtype
from worker.engines.models import locate_model
from worker.known_models import DEFAULT_MODEL
from worker.wire.messages import SamplingParams

SYSTEM_TOKENS = 300
PROMPT_RANGE = (10, 600)
MAX_TOKENS_RANGE = (16, 64)
#: about ten batches per configuration (64 requests gave four), so a figure does not hang on
#: the draw; the source scenario's 600 would take 1-2 hours on 2 CPU cores
REQUESTS = 192
CONFIGS = {
    "fifo": (False, False),
    "length_aware": (True, False),
    "length_aware+shared_prefix": (True, True),
}


def workload(n: int, vocab: int, seed: int) -> list[EngineInput]:
    """``n`` requests of random token ids; every other one starts with the system prompt."""
    rng = random.Random(seed)
    ordinary = range(100, vocab)  # clear of the special tokens at the start of the vocabulary
    system = [rng.choice(ordinary) for _ in range(SYSTEM_TOKENS)]
    inputs = []
    for i in range(n):
        length = rng.randint(*PROMPT_RANGE)
        if i % 2:
            length = max(length, SYSTEM_TOKENS + PROMPT_RANGE[0])
            head = system
        else:
            head = []
        ids = (*head, *(rng.choice(ordinary) for _ in range(length - len(head))))
        greedy = SamplingParams(max_tokens=rng.randint(*MAX_TOKENS_RANGE), temperature=0.0)
        sampling = ResolvedSampling.resolve(greedy, None, GenerationConfig())
        inputs.append(EngineInput(f"r{i}", ids, sampling))
    rng.shuffle(inputs)
    return inputs


@dataclass
class Run:
    """One configuration's progress: its own clock, completions, batches."""

    name: str
    engine: HFEngine
    wall_s: float = 0.0
    cpu_s: float = 0.0
    done: dict[str, float] = field(default_factory=dict)
    generated: int = 0
    batches: list[dict[str, int]] = field(default_factory=list)


def drive(run: Run, inputs: list[EngineInput], length_aware: bool, shared: bool) -> Iterator[None]:
    """Run every request through batcher and engine; yields after each batch."""
    limits = BatchLimits(length_aware=length_aware, shared_prefix=shared)
    batcher: DynamicBatcher[EngineInput] = DynamicBatcher(limits, dedup=False)
    for n, item in enumerate(inputs):
        ids, max_tokens = item.prompt_token_ids, item.sampling.max_tokens
        key = prefix_key_of(ids) if shared else None
        queued = Pending(item.key, ("bench", 0), n, len(ids), max_tokens, 0.0, item)
        batcher.add(replace(queued, prefix_key=key), 0.0)
    prefixes = run.engine.prefixes
    while (batch := batcher.next_batch(0.0, flush=True)) is not None:
        payloads = [p.payload for p in batch.items]
        saved = prefixes.positions_saved if prefixes is not None else 0
        start, start_cpu = time.perf_counter(), time.process_time()

        def finished(c: Completion, run: Run = run, start: float = start) -> None:
            run.done[c.key] = run.wall_s + time.perf_counter() - start
            run.generated += c.completion_tokens

        run.engine.run_batch(payloads, finished)
        run.wall_s += time.perf_counter() - start
        run.cpu_s += time.process_time() - start_cpu
        if prefixes is not None:
            saved = prefixes.positions_saved - saved
        run.batches.append(
            {
                "size": batch.size,
                "prompt_tokens": batch.prompt_tokens,
                "padding": batch.padding,
                # positions prefill ran over: the padded batch, less what the prefix cache saved
                "prefill_positions": batch.size * batch.longest_prompt - saved,
            }
        )
        for pending in batch.items:
            batcher.complete(pending.key)
        yield


def _ignore(_: Completion) -> None:
    pass


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def summary(run: Run, inputs: list[EngineInput]) -> dict[str, Any]:
    latencies = list(run.done.values())
    prompt = sum(b["prompt_tokens"] for b in run.batches)
    padding = sum(b["padding"] for b in run.batches)
    prefixes = run.engine.prefixes
    return {
        "name": run.name,
        "wall_s": round(run.wall_s, 1),
        "cpu_s": round(run.cpu_s, 1),
        "requests_per_s": round(len(inputs) / run.wall_s, 4),
        "generated_tokens_per_s": round(run.generated / run.wall_s, 2),
        "total_tokens_per_s": round((run.generated + prompt) / run.wall_s, 1),
        "requests_per_cpu_s": round(len(inputs) / run.cpu_s, 4),
        "latency_p50_s": round(percentile(latencies, 50), 1),
        "latency_p99_s": round(percentile(latencies, 99), 1),
        "batches": len(run.batches),
        "mean_batch_size": round(len(inputs) / len(run.batches), 2),
        "padding_waste": round(padding / prompt, 4),
        "padding_waste_mean_per_batch": round(
            sum(b["padding"] / b["prompt_tokens"] for b in run.batches) / len(run.batches), 4
        ),
        "prompt_tokens": prompt,
        "prefill_positions": sum(b["prefill_positions"] for b in run.batches),
        "prefix_cache": None
        if prefixes is None
        else {
            "hits": prefixes.hits,
            "misses": prefixes.misses,
            "positions_saved": prefixes.positions_saved,
        },
        "batch_sizes": [b["size"] for b in run.batches],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    rows = result["configs"]
    names = [r["name"] for r in rows]
    figure = Figure(figsize=(15, 4.5))
    axes = figure.subplots(1, 3)
    bars = axes[0].bar(names, [r["requests_per_s"] for r in rows], color="tab:blue")
    axes[0].bar_label(bars, labels=[f"{r['throughput_vs_fifo']}x" for r in rows], fontsize=8)
    axes[0].set_ylabel("requests/s (label: vs FIFO)")
    axes[0].set_title(f"{result['requests']} requests, {result['model']} on CPU", fontsize=10)
    xs = range(len(rows))
    axes[1].bar([x - 0.2 for x in xs], [r["latency_p50_s"] for r in rows], 0.4, label="P50")
    axes[1].bar([x + 0.2 for x in xs], [r["latency_p99_s"] for r in rows], 0.4, label="P99")
    axes[1].set_xticks(list(xs), names)
    axes[1].set_ylabel("latency from arrival (t=0), s")
    axes[1].legend(fontsize=8)
    waste = [r["padding_waste"] for r in rows]
    net = [round(r["prefill_positions"] / r["prompt_tokens"] - 1, 3) for r in rows]
    for offset, values, label in (
        (-0.2, waste, "padding / prompt tokens"),
        (0.2, net, "prefill positions run / prompt tokens - 1"),
    ):
        bars = axes[2].bar([x + offset for x in xs], values, 0.4, label=label)
        axes[2].bar_label(bars, fmt="%.2f", fontsize=7)
    axes[2].axhline(0, color="black", linewidth=0.5)
    axes[2].set_xticks(list(xs), names)
    axes[2].set_title("prefill waste (below 0: the prefix cache runs less than the prompts)")
    axes[2].title.set_fontsize(9)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7)
    figure.suptitle("bench.formation", fontsize=12)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=REQUESTS,
        help=f"requests, the same for every configuration (default: {REQUESTS})",
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    model, tokenizer = load_pretrained(
        locate_model(DEFAULT_MODEL), device, resolve_dtype("auto", device)
    )
    inputs = workload(args.requests, len(tokenizer), args.seed)
    runs, drivers = [], []
    for name, (length_aware, shared) in CONFIGS.items():
        engine = HFEngine(
            EngineConfig(device="cpu"),
            batching=BatchingConfig(length_aware=length_aware, shared_prefix=shared),
            ignore_eos=True,
            preloaded=(model, tokenizer),
        )
        engine.load()
        # warm-up on a short prompt of its own: first-call allocations, not the system prompt
        warm = ResolvedSampling.resolve(SamplingParams(2), None, GenerationConfig())
        engine.run_batch([EngineInput("w", tuple(range(100, 120)), warm)], _ignore)
        run = Run(name, engine)
        runs.append(run)
        drivers.append(drive(run, inputs, length_aware, shared))
    load_before = os.getloadavg()
    while drivers:
        drivers = [d for d in drivers if next(d, StopIteration) is not StopIteration]
    rows = [summary(run, inputs) for run in runs]
    fifo = rows[0]
    for row in rows:
        row["throughput_vs_fifo"] = round(row["requests_per_s"] / fifo["requests_per_s"], 2)
        row["cpu_throughput_vs_fifo"] = round(
            row["requests_per_cpu_s"] / fifo["requests_per_cpu_s"], 2
        )
        row["p99_vs_fifo"] = round(row["latency_p99_s"] / fifo["latency_p99_s"], 2)
    result = {
        "model": DEFAULT_MODEL,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "requests": args.requests,
        "requests_note": "SmolLM2 on 2 shared CPU cores runs this mix at 0.3-0.7 requests/s, "
        "so 600 requests x 3 configurations would take 1-2 hours; with few requests each "
        "configuration forms only a few batches and the figures depend on the draw (--seed)",
        "workload": {
            "prompt_tokens": list(PROMPT_RANGE),
            "shared_system_prompt_tokens": SYSTEM_TOKENS,
            "shared_fraction": 0.5,
            "max_tokens": list(MAX_TOKENS_RANGE),
            "arrivals": "all at t=0 (offline batch); latency = completion - arrival",
            "decoding": "greedy, EOS suppressed: every request generates max_tokens",
            "seed": args.seed,
        },
        "limits": {"max_batch_size": 32, "max_batch_tokens": 8192},
        "driven_by": "DynamicBatcher + HFEngine directly (no Kafka), configurations "
        "interleaved batch by batch, each on its own clock",
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "configs": rows,
    }
    path = write_result("formation", result)
    plot(result, RESULTS / "formation.png")
    brief = {r["name"]: {k: v for k, v in r.items() if k != "batch_sizes"} for r in rows}
    print(json.dumps(brief, indent=2))
    print(path)
    return result


if __name__ == "__main__":
    main()
