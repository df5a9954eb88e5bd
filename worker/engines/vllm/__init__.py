"""The vLLM engine (``engine.kind: vllm``): :class:`~worker.engines.vllm.engine.VllmEngine`."""
