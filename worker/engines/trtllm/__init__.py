"""The TensorRT-LLM engine, for NVIDIA GPUs: ``tensorrt_llm.LLM`` fed in flight.

:mod:`~worker.engines.trtllm.engine` is the engine, :mod:`~worker.engines.trtllm.mapping`
turns resolved sampling settings into TensorRT-LLM's and its results into completions,
and :mod:`~worker.engines.trtllm.loop` is the event loop that lives as long as the engine.

What was verified, and how: written against TensorRT-LLM 1.2.x's LLM API (PyTorch
backend; the project pins ``tensorrt-llm==1.2.1``) as read from the NVIDIA/TensorRT-LLM
sources, file by file in each module's docstring. It has NOT been executed against
TensorRT-LLM: CI has no NVIDIA GPU, and the GPU machine lent to this project cannot take
TensorRT-LLM's wheel (far over what can be carried there; no network). Its unit tests
drive it through a stand-in package (``tests/unit/worker/engines/fake_trtllm``), as strict
as those sources on each point where the engine was once wrong; the tests against the
real package skip with "tensorrt_llm not installed (needs an NVIDIA GPU; ...)".
"""

from worker.engines.trtllm.engine import TrtLlmEngine, TrtLlmFailed

__all__ = ["TrtLlmEngine", "TrtLlmFailed"]
