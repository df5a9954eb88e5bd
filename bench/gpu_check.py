"""The hf engine on an NVIDIA GPU, for a machine that has one (run by bench/gpu_check.sh).

Nothing can be downloaded there, so the model is a Llama built from a ``LlamaConfig``
with random weights (TinyLlama-1.1B's shape, bf16) and a word-level tokenizer made in
memory; requests are fed as ``prompt_token_ids``. Fixed lengths: 256 prompt tokens,
128 generated (EOS suppressed), greedy.

Measures, written to bench/results/gpu_hf_engine.json:

* generated tokens/s at batch 1, 8, 32, 64, with the pinned staging pool and without it
  (``engine.pinned_memory``), and whether greedy text matches the batch-1 run;
* the staging step alone (host buffers → device) for a 64 × 2048 batch, pinned vs not.

Stops starting new measurements once ``--budget-s`` is spent and writes what it has.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.hf.engine import HFEngine
from worker.engines.hf.pinned import PinnedBufferPool
from worker.wire.messages import SamplingParams

PROMPT_TOKENS = 256
NEW_TOKENS = 128
VOCAB = 32000


def random_llama(device: torch.device, layers: int) -> tuple[Any, Any]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(config).bfloat16()
    return model, tokenizer


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
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_hf_engine.json"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device (is this the GPU machine?)")
    started = time.perf_counter()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    model, tokenizer = random_llama(device, args.layers)
    rng = random.Random(0)
    count = max(8, 2 * max(sizes))
    prompts = [tuple(rng.randrange(3, VOCAB) for _ in range(PROMPT_TOKENS)) for _ in range(count)]
    greedy = ResolvedSampling.resolve(
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0), None, GenerationConfig()
    )
    inputs = [EngineInput(str(i), ids, greedy) for i, ids in enumerate(prompts)]
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "none (cpu)",
        "torch": torch.__version__,
        "model": f"random-weight Llama, TinyLlama-1.1B shape, {args.layers} layers, bf16",
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
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
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
