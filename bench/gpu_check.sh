#!/usr/bin/env bash
# The engine checks that need an NVIDIA GPU, as one script for a lent GPU machine (under
# 9 minutes): the CUDA paths of the pinned staging pool's unit tests, then bench/gpu_check.py
# — the hf engine on CUDA with and without pinned staging, the whole worker pipeline feeding
# it short requests (is the engine busy?), the trtllm engine in flight on
# load_format="dummy" if tensorrt_llm is importable, vLLM if vllm is importable — which
# writes bench/results/gpu_check.json. Needs a Python whose torch has CUDA, plus
# transformers and tokenizers; nothing is downloaded. PYTHON=... picks the interpreter.
# Ran once, on an H200 without vLLM or TensorRT-LLM (bench/README.md says how).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", ok); sys.exit(0 if ok else 1)'

if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/unit/worker/engines/test_pinned.py
fi
timeout 480 "$PY" -m bench.gpu_check --budget-s 420 "$@"
