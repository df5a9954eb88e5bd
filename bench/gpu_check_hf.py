"""bench/gpu_check.py's ``hf`` section: the hf engine on CUDA, with and without pinned staging.

Generated tokens/s at each batch size with the pinned staging pool and without it
(``engine.pinned_memory``), whether greedy text matches the batch-1 run, and the staging
step alone (64 × 2048 ids host → device), pinned vs pageable. Stops starting new
measurements once ``--budget-s`` is spent and writes what it has.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from bench.gpu_check import NEW_TOKENS, VOCAB, llama_config, prompts, word_tokenizer
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.pinned import PinnedBufferPool
from worker.wire.messages import SamplingParams


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    engine: HFEngine, inputs: list[EngineInput], size: int
) -> tuple[float, dict[str, Completion]]:
    done: dict[str, Completion] = {}
    sync(engine.device)
    start = time.perf_counter()
    for first in range(0, len(inputs), size):
        engine.run_batch(inputs[first : first + size], lambda c: done.__setitem__(c.key, c))
    sync(engine.device)
    return time.perf_counter() - start, done


def staging_ms(device: torch.device, pinned: bool, repeats: int = 50) -> float:
    pool = PinnedBufferPool(device, 64 * 2048, pin=pinned)
    rows = [[random.randrange(VOCAB) for _ in range(2048)] for _ in range(64)]
    pool.stage(rows, 0)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        staged = pool.stage(rows, 0)
        staged.input_ids.sum()  # a consumer on the compute stream, as generate would be
    sync(device)
    return (time.perf_counter() - start) / repeats * 1000


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    started = time.perf_counter()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(llama_config(args.layers)).bfloat16()  # type: ignore[no-untyped-call]
    tokenizer = word_tokenizer()
    greedy = ResolvedSampling.resolve(
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0), None, GenerationConfig()
    )
    inputs = [
        EngineInput(str(i), ids, greedy) for i, ids in enumerate(prompts(max(8, 2 * max(sizes))))
    ]
    result: dict[str, Any] = {
        "runs": [],
        "staging_64x2048_ms": {
            "pinned": staging_ms(device, True),
            "pageable": staging_ms(device, False),
        },
    }
    batching = BatchingConfig(max_batch_size=max(sizes), max_batch_tokens=8192)
    alone: dict[bool, dict[str, Completion]] = {}
    for pinned in (True, False):
        config = EngineConfig(
            model="random-llama",
            device="cuda" if device.type == "cuda" else "cpu",
            pinned_memory=pinned,
        )
        engine = HFEngine(config, batching=batching, ignore_eos=True, preloaded=(model, tokenizer))
        engine.load()
        measure(engine, inputs[:2], 2)  # warm-up: kernels, allocator
        for size in sizes:
            if time.perf_counter() - started > args.budget_s:
                result["stopped_early"] = f"budget of {args.budget_s} s spent"
                break
            batch_inputs = inputs[: max(8, 2 * size)]
            seconds, done = measure(engine, batch_inputs, size)
            if size == 1:
                alone[pinned] = done
            baseline = alone.get(pinned, {}) if size > 1 else {}
            same = sum(done[k].text == baseline[k].text for k in baseline)
            run = {
                "pinned": pinned,
                "batch_size": size,
                "requests": len(batch_inputs),
                "tokens_per_s": round(len(batch_inputs) * NEW_TOKENS / seconds, 1),
                "identical_to_batch_1": f"{same}/{len(baseline)}" if baseline else None,
                "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if device.type == "cuda"
                else None,
            }
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
        engine.close()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
