"""The hf engine on the CPU: throughput by static batch size, and greedy identity.

The same 32 chat requests run at each batch size, greedy, each forced to generate exactly
32 new tokens (EOS suppressed), so every size does the same work. Tokens/s counts
generated tokens over wall time; each size runs ``--rounds`` times, interleaved, and the
best round counts (this machine is shared). Batch size 1 runs every request alone, so comparing
each request's text at size N with size 1 measures whether batching (left padding,
different matmul shapes) changes greedy output.

    python -m bench.engine_cpu            # writes bench/results/engine_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from worker.config import EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.model import load_pretrained, resolve_dtype
from worker.engines.models import locate_model
from worker.known_models import DEFAULT_MODEL
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

NEW_TOKENS = 32
TOPICS = (
    "the sea", "autumn", "a lighthouse", "coffee", "mountains", "a library", "rain",
    "the moon", "a train journey", "gardening", "snow", "a city at night", "bees",
    "an old clock", "the desert", "friendship", "a river", "bread", "thunderstorms",
    "a violin", "the first day of school", "foxes", "a market", "sailing", "stars",
    "a quiet morning", "chess", "the wind", "a bridge", "paper boats", "winter tea",
    "a forest path",
)  # fmt: skip
STYLES = (
    "Write a haiku about {}.",
    "In two sentences, explain why people like {}.",
    "Give me three short facts about {}, one per line, with a brief reason for each.",
    "Describe {} to a child.",
)


def requests(engine: HFEngine) -> list[EngineInput]:
    """32 chat prompts of varied length, so batches need real left padding."""
    inputs = []
    for i, topic in enumerate(TOPICS):
        text = STYLES[i % len(STYLES)].format(topic)
        chat = (ChatMessage("user", text),)
        ids = engine.encode(InferenceRequest(custom_id=str(i), messages=chat))
        greedy = ResolvedSampling.resolve(
            SamplingParams(max_tokens=NEW_TOKENS, temperature=0), None, GenerationConfig()
        )
        inputs.append(EngineInput(str(i), ids, greedy))
    return inputs


def run_at(
    engine: HFEngine, inputs: list[EngineInput], size: int
) -> tuple[float, dict[str, Completion]]:
    done: dict[str, Completion] = {}
    start = time.perf_counter()
    for first in range(0, len(inputs), size):
        engine.run_batch(inputs[first : first + size], lambda c: done.__setitem__(c.key, c))
    return time.perf_counter() - start, done


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,4,8,16,32")
    parser.add_argument("--rounds", type=int, default=2, help="the best round is reported")
    parser.add_argument("--out", type=Path, default=Path("bench/results/engine_cpu.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    device = torch.device("cpu")
    load_start = time.perf_counter()
    model, tokenizer = load_pretrained(
        locate_model(DEFAULT_MODEL), device, resolve_dtype("auto", device)
    )
    engine = HFEngine(EngineConfig(device="cpu"), ignore_eos=True, preloaded=(model, tokenizer))
    engine.load()
    load_s = time.perf_counter() - load_start
    inputs = requests(engine)
    engine.run_batch(inputs[:2], lambda c: None)  # warm-up: first-call allocations, caches
    load_before = os.getloadavg()
    tokens = NEW_TOKENS * len(inputs)
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    identical: dict[int, int] = {}
    alone: dict[str, Completion] = {}
    # rounds interleave the sizes, so a burst of load elsewhere hits one round, not one size
    for round_ in range(args.rounds):
        for size in sizes:
            seconds, done = run_at(engine, inputs, size)
            assert all(c.completion_tokens == NEW_TOKENS for c in done.values())
            if size == 1 and not alone:
                alone = done
            elif alone:
                same = sum(done[k].text == alone[k].text for k in alone)
                identical[size] = min(identical.get(size, same), same)
            rates[size].append(round(tokens / seconds, 1))
            print(
                json.dumps({"round": round_, "batch_size": size, "tokens_per_s": rates[size][-1]})
            )
    base = max(rates[1]) if 1 in rates else None
    rows = [
        {
            "batch_size": size,
            "tokens_per_s": max(rates[size]),
            "tokens_per_s_each_round": rates[size],
            "ratio_vs_batch_1": round(max(rates[size]) / base, 2) if base else None,
            "greedy_identical_to_alone": f"{identical[size]}/{len(alone)}"
            if size in identical
            else None,
        }
        for size in sizes
    ]
    result = {
        "model": DEFAULT_MODEL,
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "requests": len(inputs),
        "new_tokens_per_request": NEW_TOKENS,
        "decoding": "greedy, EOS suppressed (min_new_tokens)",
        "rounds": args.rounds,
        "load_seconds": round(load_s, 1),
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
