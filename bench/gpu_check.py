"""The engine checks that need an NVIDIA GPU, as one run (started by bench/gpu_check.sh).

Nothing can be downloaded on the GPU machine, so the model is a Llama built from a
``LlamaConfig`` (TinyLlama-1.1B's shape, bf16) with random weights and a word-level
tokenizer made in memory; requests are fed as token ids. Fixed lengths: 256 prompt tokens,
128 generated (EOS ignored), greedy. Three sections, each in a process of its own with a
share of ``--budget-s``, so one engine's failure or memory never spoils another's:

* ``hf``: generated tokens/s of the hf engine at batch 1, 8, 32, 64, with the pinned
  staging pool and without it (``engine.pinned_memory``), whether greedy text matches the
  batch-1 run, and the staging step alone (64 × 2048 ids host → device), pinned vs not;
* ``trtllm``: the trtllm engine in flight on ``load_format="dummy"``, when ``tensorrt_llm``
  is importable (bench/gpu_check_engines.py);
* ``vllm``: vLLM's own ``LLM.generate`` on ``load_format="dummy"``, when ``vllm`` is
  importable (bench/gpu_check_engines.py);
* ``pipeline``: the whole worker on the embedded broker feeding the hf engine on CUDA with
  short requests: is the engine busy, or does it wait for the worker
  (bench/gpu_check_pipeline.py)?

Writes bench/results/gpu_check.json; a section that could not run records why.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT_TOKENS = 256
NEW_TOKENS = 128
VOCAB = 32000
SECTIONS = {"hf": 0.35, "pipeline": 0.45, "trtllm": 0.45, "vllm": 0.25}  # shares of the budget
ENGINE_MODULES = {"trtllm": "tensorrt_llm", "vllm": "vllm"}


def llama_config(layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        dtype="bfloat16",
    )


def word_tokenizer() -> Any:
    """A word-level tokenizer over ``VOCAB`` made-up words: every id decodes to a word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def prompts(count: int) -> list[tuple[int, ...]]:
    rng = random.Random(0)
    return [tuple(rng.randrange(3, VOCAB) for _ in range(PROMPT_TOKENS)) for _ in range(count)]


def section_command(name: str, args: argparse.Namespace, out: Path, budget_s: float) -> list[str]:
    module = {"hf": "bench.gpu_check_hf", "pipeline": "bench.gpu_check_pipeline"}.get(
        name, "bench.gpu_check_engines"
    )
    command = [sys.executable, "-m", module, "--out", str(out), "--layers", str(args.layers)]
    command += ["--batch-sizes", args.batch_sizes, "--device", args.device]
    command += ["--budget-s", f"{budget_s:.0f}"]
    return command + ([] if name in ("hf", "pipeline") else ["--engine", name])


def run_section(name: str, args: argparse.Namespace, budget_s: float) -> dict[str, Any]:
    module = ENGINE_MODULES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        return {"skipped": f"{module} is not importable on this machine"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.json"
        command = section_command(name, args, out, budget_s)
        try:
            # the section stops starting work at its budget; the margin lets it finish a step
            done = subprocess.run(command, timeout=budget_s + 20, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish within {budget_s + 20:.0f} s"}
        sys.stderr.write(done.stderr[-4000:])
        if done.returncode != 0 or not out.exists():
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"}
        section: dict[str, Any] = json.loads(out.read_text())
        return section


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--budget-s", type=float, default=450.0)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the hf section")
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu_check.json"))
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA device (is this the GPU machine?)")
    started = time.perf_counter()
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "none (cpu)",
        "torch": torch.__version__,
        "model": f"random-weight Llama, TinyLlama-1.1B shape, {args.layers} layers, bf16",
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
    }
    for name in args.sections.split(","):
        result[name] = run_section(name, args, args.budget_s * SECTIONS[name])
        print(json.dumps({name: result[name]})[:2000], flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
