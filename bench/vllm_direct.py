"""vLLM fed directly (no Kafka): static waves against requests kept in flight, one run.

The same chat requests (prompts of 5–200 words, ``max_tokens`` drawn from 8–256, greedy,
EOS ignored so each generates exactly ``max_tokens``) go through one loaded
:class:`~worker.engines.vllm.engine.VllmEngine` twice:

* **waves**: submit ``--wave`` requests, wait until every one has finished, then the next
  wave — what a static feeder does to an in-flight engine (it idles at each wave's tail);
* **in flight**: keep ``--wave`` requests submitted, submitting the next as each finishes.

Tokens/s counts generated tokens over wall time. With ``--rounds`` above 1 the modes
alternate and each one's best round counts (this machine is shared). ``--dtypes`` runs the
whole comparison once per dtype, each on a freshly loaded engine, and records the
in-flight rate of each.

    python -m bench.vllm_direct           # writes bench/results/vllm_direct.json
"""

from __future__ import annotations

import argparse
import os
import random
import time
from argparse import Namespace
from typing import Any, Literal

from bench.common import write_result
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.vllm.engine import VllmEngine
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

WORDS = (
    "river", "stone", "light", "garden", "window", "morning", "quiet", "market", "letter",
    "bridge", "winter", "story", "paper", "music", "harbor", "forest", "lantern", "thunder",
    "orchard", "candle", "valley", "engine", "signal", "silver", "meadow",
)  # fmt: skip
#: how long one mode may take before the run is declared stuck (a bound, not a pace)
STUCK_S = 3600.0


def workload(engine: VllmEngine, count: int, seed: int) -> list[EngineInput]:
    """``count`` chat requests of 5–200 words, ``max_tokens`` in 8–256, greedy."""
    rng = random.Random(seed)
    inputs = []
    for i in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 200)))
        chat = (ChatMessage("user", f"Continue this list of words: {words}"),)
        ids = engine.encode(InferenceRequest(custom_id=str(i), messages=chat))
        sampling = SamplingParams(max_tokens=rng.randint(8, 256), temperature=0)
        inputs.append(
            EngineInput(str(i), ids, ResolvedSampling.resolve(sampling, None, GenerationConfig()))
        )
    return inputs


def _drain(engine: VllmEngine, done: dict[str, Completion], deadline: float) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"stuck: {len(done)} requests finished in {STUCK_S:.0f} s")
    for completion in engine.completions(timeout_s=1.0):
        assert completion.error is None, completion.error
        done[completion.key] = completion


def waves(engine: VllmEngine, inputs: list[EngineInput], size: int) -> dict[str, Completion]:
    done: dict[str, Completion] = {}
    deadline = time.monotonic() + STUCK_S
    for first in range(0, len(inputs), size):
        for item in inputs[first : first + size]:
            engine.submit(item)
        while len(done) < min(first + size, len(inputs)):
            _drain(engine, done, deadline)
    return done


def in_flight(engine: VllmEngine, inputs: list[EngineInput], size: int) -> dict[str, Completion]:
    done: dict[str, Completion] = {}
    deadline = time.monotonic() + STUCK_S
    queued = list(reversed(inputs))
    while len(done) < len(inputs):
        while queued and len(inputs) - len(queued) - len(done) < size:
            engine.submit(queued.pop())
        _drain(engine, done, deadline)
    return done


MODES = {"waves": waves, "in_flight": in_flight}
DTYPES: dict[str, Literal["float32", "float16", "bfloat16"]] = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
}


def compare(dtype: Literal["float32", "float16", "bfloat16"], args: Namespace) -> dict[str, Any]:
    """Both modes on one engine loaded with ``dtype``."""
    batching = BatchingConfig(max_batch_size=args.wave, max_batch_tokens=args.budget)
    engine = VllmEngine(EngineConfig(kind="vllm", dtype=dtype), batching, ignore_eos=True)
    start = time.perf_counter()
    engine.load()
    load_s = time.perf_counter() - start
    try:
        inputs = workload(engine, args.requests, args.seed)
        tokens = sum(item.sampling.max_tokens for item in inputs)
        in_flight(engine, inputs[:2], 2)  # warm-up
        rates: dict[str, list[float]] = {mode: [] for mode in MODES}
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        for round_ in range(args.rounds):
            for mode, feed in MODES.items():
                began = time.perf_counter()
                done = feed(engine, inputs, args.wave)
                took = time.perf_counter() - began
                assert sum(c.completion_tokens for c in done.values()) == tokens
                seconds[mode].append(round(took, 1))
                rates[mode].append(round(tokens / took, 1))
                print(f"{dtype} round {round_} {mode}: {took:.1f} s, {rates[mode][-1]} tok/s")
    finally:
        engine.close()
    best = {mode: max(rates[mode]) for mode in MODES}
    return {
        "dtype": dtype,
        "load_seconds": round(load_s, 1),
        "generated_tokens": tokens,
        "modes": {
            mode: {
                "tokens_per_s": best[mode],
                "requests_per_s": round(best[mode] * len(inputs) / tokens, 2),
                "seconds_each_round": seconds[mode],
                "tokens_per_s_each_round": rates[mode],
            }
            for mode in MODES
        },
        "in_flight_vs_waves": round(best["in_flight"] / best["waves"], 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--wave", type=int, default=32, help="wave size = sequences in flight")
    parser.add_argument("--budget", type=int, default=16384, help="max_batch_tokens")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtypes", default="float32", help="e.g. float32,bfloat16")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    runs = [compare(DTYPES[dtype], args) for dtype in args.dtypes.split(",")]
    import vllm

    result = {
        "engine": "vllm",
        "vllm": vllm.__version__,
        "model": EngineConfig().model,
        "requests": args.requests,
        "wave_size": args.wave,
        "max_batch_tokens": args.budget,
        "workload": "chat, prompts 5-200 words, max_tokens 8-256, greedy, EOS ignored",
        "seed": args.seed,
        "rounds": args.rounds,
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        "runs": runs,
    }
    write_result("vllm_direct", result)
    return result


if __name__ == "__main__":
    main()
