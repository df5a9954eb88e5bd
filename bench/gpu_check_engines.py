"""bench/gpu_check.py's ``trtllm`` and ``vllm`` sections: the in-flight engines on a GPU.

Both load a checkpoint directory that holds only ``config.json`` (the random Llama of
bench/gpu_check.py) and the word-level tokenizer, with ``load_format="dummy"``: random
weights, nothing downloaded. The same 256-token prompts, 128 tokens each, EOS ignored,
greedy.

* ``trtllm``: batchpipe's trtllm engine (worker/engines/trtllm), fed in flight as the
  worker feeds it — a request submitted whenever :meth:`capacity` has room, completions
  read as they come. Records load time, generated tokens/s, whether greedy text is the
  same alone and in flight, and that an aborted request is never completed.
* ``vllm``: vLLM's own ``LLM.generate`` over the same prompts (token ids in), as the
  reference figure for an in-flight engine on this GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.gpu_check import NEW_TOKENS, PROMPT_TOKENS, llama_config, prompts, word_tokenizer
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, InFlightEngine, ResolvedSampling
from worker.wire.messages import SamplingParams


def write_checkpoint(directory: Path, layers: int) -> Path:
    """``config.json`` and the tokenizer files: all ``load_format="dummy"`` reads."""
    llama_config(layers).save_pretrained(directory)
    word_tokenizer().save_pretrained(directory)
    return directory


def feed(engine: InFlightEngine, inputs: Sequence[EngineInput], limit_s: float) -> dict[str, Any]:
    """Completions of ``inputs``, submitted whenever the engine has room for the next one."""
    waiting = deque(inputs)
    done: dict[str, Completion] = {}
    deadline = time.monotonic() + limit_s
    while len(done) < len(inputs) and time.monotonic() < deadline:
        room = engine.capacity()
        while waiting and room.sequences > 0 and room.tokens >= cost(waiting[0]):
            engine.submit(waiting.popleft())
            room = engine.capacity()
        for completion in engine.completions(timeout_s=0.05):
            done[completion.key] = completion
    return done


def cost(item: EngineInput) -> int:
    return len(item.prompt_token_ids) + item.sampling.max_tokens


def trtllm(
    checkpoint: Path, inputs: list[EngineInput], batch: int, budget_s: float
) -> dict[str, Any]:
    from worker.engines.trtllm import TrtLlmEngine

    config = EngineConfig(
        kind="trtllm", model=str(checkpoint), dtype="bfloat16", load_format="dummy"
    )
    batching = BatchingConfig(
        max_batch_size=batch, max_batch_tokens=batch * cost(inputs[0]), prefetch_count=batch
    )
    engine = TrtLlmEngine(config, batching, ignore_eos=True)
    started = time.perf_counter()
    engine.load()
    result: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 1), "batch": batch}
    try:
        feed(engine, inputs[:2], budget_s)  # warm-up
        alone = {i.key: feed(engine, [i], budget_s)[i.key] for i in inputs[:4]}
        start = time.perf_counter()
        done = feed(engine, inputs, budget_s)
        seconds = time.perf_counter() - start
        generated = sum(c.completion_tokens for c in done.values())
        failed = [c.error.message for c in done.values() if c.error is not None]
        same = sum(done[k].text == alone[k].text for k in alone if k in done)
        result |= {
            "requests": len(inputs),
            "completed": len(done),
            "errors": failed[:3],
            "tokens_per_s": round(generated / seconds, 1),
            "identical_alone_and_in_flight": f"{same}/{len(alone)}",
            "abort_never_completed": aborted_stays_silent(engine, inputs[0]),
        }
    finally:
        engine.close()
    return result


def aborted_stays_silent(engine: InFlightEngine, item: EngineInput) -> bool:
    """Submit two requests and abort one at once: only the other may ever complete."""
    engine.submit(EngineInput("aborted", item.prompt_token_ids, item.sampling))
    engine.submit(EngineInput("kept", item.prompt_token_ids, item.sampling))
    engine.abort(["aborted"])
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while "kept" not in seen and time.monotonic() < deadline:
        seen |= {c.key for c in engine.completions(timeout_s=1.0)}
    # the aborted one finished no later than the kept one: a completion of it would be here
    seen |= {c.key for c in engine.completions(timeout_s=1.0)}
    return "kept" in seen and "aborted" not in seen


def vllm(checkpoint: Path, inputs: list[EngineInput], batch: int) -> dict[str, Any]:
    vllm_api: Any = importlib.import_module("vllm")  # an optional package without stubs
    LLM, VllmSampling = vllm_api.LLM, vllm_api.SamplingParams
    started = time.perf_counter()
    llm = LLM(
        model=str(checkpoint),
        load_format="dummy",
        dtype="bfloat16",
        max_num_seqs=batch,
        gpu_memory_utilization=0.8,
        seed=0,
    )
    result: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 1), "batch": batch}
    params = VllmSampling(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    token_prompts: list[Any] = [{"prompt_token_ids": list(i.prompt_token_ids)} for i in inputs]
    llm.generate(token_prompts[:2], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(token_prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return result | {"requests": len(inputs), "tokens_per_s": round(generated / seconds, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("trtllm", "vllm"), required=True)
    parser.add_argument("--batch-sizes", default="1,8,32,64", help="the largest is the batch")
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    batch = max(int(s) for s in args.batch_sizes.split(","))
    greedy = ResolvedSampling.resolve(
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0), None, GenerationConfig()
    )
    inputs = [EngineInput(str(i), ids, greedy) for i, ids in enumerate(prompts(2 * batch))]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_checkpoint(Path(tmp), args.layers)
        if args.engine == "trtllm":
            result = trtllm(checkpoint, inputs, batch, args.budget_s)
        else:
            result = vllm(checkpoint, inputs, batch)
    result["prompt_tokens"] = PROMPT_TOKENS
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
