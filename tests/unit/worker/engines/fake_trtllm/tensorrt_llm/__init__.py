"""A stand-in for TensorRT-LLM 1.2.x's LLM API: what ``worker/engines/trtllm`` calls, no more.

Names, signatures and behaviour follow the NVIDIA/TensorRT-LLM sources:

* ``tensorrt_llm/llmapi/llm.py`` — ``LLM(model, tokenizer=None, ..., dtype="auto",
  **kwargs)`` refuses unknown keyword arguments with "got invalid argument";
  ``generate_async(inputs, sampling_params=None, ..., streaming=False, ...)``;
  ``_prepare_sampling_params`` calls ``SamplingParams._setup(tokenizer)`` when ``end_id``
  is unset; ``_check_arguments`` refuses a prompt over ``max_num_tokens`` ("The sum of
  prompt length (N), query length (0) should not exceed max_num_tokens (M)"), as a
  ``ValueError`` in earlier 1.x releases and a ``RequestError`` in newer ones
  (``LLM.limit_error`` picks which); ``shutdown()``.
* ``tensorrt_llm/sampling_params.py`` — ``SamplingParams`` (see ``sampling_params.py``).
* ``tensorrt_llm/executor/result.py`` and ``utils.py`` — see ``executor.py``.
* ``tensorrt_llm/llmapi/llm_args.py`` — ``KvCacheConfig`` (see ``llmapi.py``).

The "model" answers a prompt with the prompt's tokens in reverse order, then the end token
(its ``generation_config.json``'s end of turn when it has one), then starts over (without
an end token when ``ignore_eos``). Greedy decoding always takes those tokens; sampling
takes each or the next id, drawn from one generator seeded 42 whatever the request's
seed, with no penalty applied, as TorchSampler of 1.2.x does. A ``json`` guide is compiled
strictly by xgrammar, not enforced on the answer. With ``logprobs=k`` each generated
token comes with TorchSampler's top k (see ``executor.py`` for these points and the
sources they follow). Its executor runs on
a thread of its own and can be held (:meth:`FakeExecutor.hold`) so a test can act while
requests are in flight.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .executor import FakeExecutor, GenerationResult, RequestError
from .sampling_params import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]

RequestOutput = GenerationResult

# the TorchLlmArgs fields the engine passes (tensorrt_llm/llmapi/llm_args.py)
_ACCEPTED = {"backend", "max_batch_size", "max_num_tokens", "kv_cache_config", "load_format"}
_ACCEPTED |= {"guided_decoding_backend"}  # BaseLlmArgs: "xgrammar" or "llguidance"


class LLM:
    instances: ClassVar[list[LLM]] = []  # every LLM made, so a test can reach the engine's
    limit_error: type[Exception] = RequestError

    def __init__(self, model: str, tokenizer: Any = None, dtype: str = "auto", **kwargs: Any):
        for key in kwargs:
            if key not in _ACCEPTED:
                raise ValueError(f"{type(self).__name__} got invalid argument: {key}")
        backend = kwargs.get("guided_decoding_backend")
        if backend not in (None, "xgrammar", "llguidance"):
            raise ValueError(f"invalid guided_decoding_backend: {backend}")
        if str(kwargs.get("load_format", "auto")).upper() not in ("AUTO", "DUMMY"):
            raise NotImplementedError(f"Invalid LoadFormat: {kwargs['load_format']}")
        from transformers import AutoTokenizer

        self.args: dict[str, Any] = {"model": model, "dtype": dtype, **kwargs}
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
        self.executor = FakeExecutor(self.tokenizer, model)
        self.requests: list[tuple[list[int], SamplingParams]] = []
        LLM.instances.append(self)

    def generate_async(
        self,
        inputs: list[int],
        sampling_params: SamplingParams | None = None,
        streaming: bool = False,
    ) -> RequestOutput:
        if self.executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")
        params = sampling_params or SamplingParams()
        if params.end_id is None:
            params._setup(self.tokenizer)
        limit = self.args.get("max_num_tokens")
        if limit and len(inputs) > limit:
            raise self.limit_error(
                f"The sum of prompt length ({float(len(inputs))}), query length (0) "
                f"should not exceed max_num_tokens ({limit})"
            )
        self.requests.append((list(inputs), params))
        return self.executor.submit(list(inputs), params)

    def shutdown(self) -> None:
        self.executor.shutdown()
