"""The TensorRT-LLM engine, for NVIDIA GPUs: ``tensorrt_llm.LLM`` fed in flight.

:mod:`~worker.engines.trtllm.engine` is the engine, :mod:`~worker.engines.trtllm.mapping`
turns resolved sampling settings into TensorRT-LLM's and its results into completions,
and :mod:`~worker.engines.trtllm.loop` is the event loop that lives as long as the engine.

What was verified, and how: written against TensorRT-LLM 1.2.x's LLM API (PyTorch
backend; the project pins ``tensorrt-llm==1.2.1``) as read from the NVIDIA/TensorRT-LLM
sources, file by file in each module's docstring. It has NOT been executed against
TensorRT-LLM: no machine of this project's CI has an NVIDIA GPU. Its unit tests drive it
through a stand-in package (``tests/unit/worker/engines/fake_trtllm``) with the same API
surface; the tests against the real package skip with the reason
"tensorrt_llm not installed (needs an NVIDIA GPU); not run on this machine".
"""

from worker.engines.trtllm.engine import TrtLlmEngine, TrtLlmFailed

__all__ = ["TrtLlmEngine", "TrtLlmFailed"]
