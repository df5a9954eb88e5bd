"""bench/gpu_check.py's ``pipeline`` section: does the GPU wait for the worker?

The whole worker — embedded broker, poll → decode → admit → batch → run → publish →
commit, exactly once — feeding the hf engine on CUDA with short requests (a few prompt
words, ``--new-tokens`` generated: labelling-sized), a small random-weight Llama saved as a
Hugging Face directory (nothing is downloaded). Reported per configuration: answered
requests/s, the engine's busy fraction over the window (the sum of its batch times ÷ the
wall time: near 1, the engine is what limits; well below, the pipeline starves it) and the
mean batch size.

vLLM on CUDA would be the realistic in-flight engine here; its wheel cannot reach the GPU
machine (over the transfer limit, no network there), so the static hf engine stands in.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.gpu_check import VOCAB, llama_config, word_tokenizer
from tests.integration.harness import isolated_config, publish, running_worker
from worker.config import Config, EngineConfig
from worker.kafka.broker import EmbeddedBroker
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams


def save_model(directory: Path, layers: int) -> None:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(llama_config(layers))  # type: ignore[no-untyped-call]
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory)
    tokenizer = word_tokenizer()
    # chat requests go through the chat template: the words of each message, in turn
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(directory)


def requests(n: int, new_tokens: int) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            messages=(
                ChatMessage("user", " ".join(f"w{(i * 7 + k) % (VOCAB - 3)}" for k in range(12))),
            ),
            sampling=SamplingParams(max_tokens=new_tokens, temperature=0.0),
        )
        for i in range(n)
    ]


def run(config: Config, n: int, new_tokens: int, budget_s: float) -> dict[str, Any]:
    publish(config, requests(n, new_tokens))
    with running_worker(config) as worker:
        registry = worker.metrics.registry

        def answered() -> float:
            return worker.metrics.snapshot().requests

        def failed() -> int:
            return worker.metrics.snapshot().requests_failed

        def engine_seconds() -> float:
            return registry.get_sample_value("batchpipe_engine_batch_seconds_sum") or 0.0

        deadline = time.monotonic() + budget_s
        while answered() < 1 and time.monotonic() < deadline:  # group joined, model warm
            time.sleep(0.05)
        t0, a0, e0 = time.monotonic(), answered(), engine_seconds()
        while answered() < n and time.monotonic() < deadline:
            time.sleep(0.1)
        wall = time.monotonic() - t0
        done, busy = answered() - a0, engine_seconds() - e0
        return {
            "requests": int(done),
            "requests_per_s": round(done / wall, 1) if wall else 0.0,
            "engine_busy": round(busy / wall, 3) if wall else 0.0,
            "mean_batch_size": round(worker.metrics.snapshot().mean_batch_size, 1),
            "failed": failed(),
            "finished": done >= n - a0,
        }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=150)
    parser.add_argument("--device", default="cuda")
    args, _ = parser.parse_known_args(argv)
    result: dict[str, Any] = {
        "model": f"random-weight Llama, TinyLlama-1.1B width, {args.layers} layers, bf16",
        "new_tokens": args.new_tokens,
        "runs": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        model_dir = Path(tmp) / "model"
        save_model(model_dir, args.layers)
        variants = [("defaults", 64, 32), ("prefetch 512, batch 128", 512, 128)]
        for name, prefetch, batch in variants:
            left = args.budget_s - (time.monotonic() - started)
            if left < 20:
                result["runs"].append({"name": name, "skipped": "budget spent"})
                continue
            base = isolated_config(broker.bootstrap, prefix="gpu")
            engine = EngineConfig(
                kind="hf", model=str(model_dir), device=args.device, dtype="bfloat16"
            )
            config = replace(
                base,
                engine=engine,
                batching=replace(base.batching, prefetch_count=prefetch, max_batch_size=batch),
                generation=replace(base.generation, max_tokens=args.new_tokens),
            )
            row = run(config, args.requests, args.new_tokens, min(left - 10, args.budget_s / 2))
            result["runs"].append({"name": name, "prefetch_count": prefetch, **row})
            print(json.dumps(result["runs"][-1]), flush=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
