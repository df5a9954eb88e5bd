"""The Hugging Face transformers engine: static batches with ``generate`` on CPU or CUDA.

:mod:`~worker.engines.hf.engine` is the engine; :mod:`~worker.engines.hf.model` loads the
model and tokenizer; :mod:`~worker.engines.hf.sampling` makes each row honour its own
request; :mod:`~worker.engines.hf.prefix_cache` shares a common prefix's KV cache;
:mod:`~worker.engines.hf.pinned` stages token ids through pre-allocated (pinned) buffers.
"""
