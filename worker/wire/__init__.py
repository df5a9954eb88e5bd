"""The wire contract in Python: domain messages, the protobuf/JSON codec, zstd framing,
OpenAI/Bailian batch lines and request validation.

The generated protobuf code (``_generated``, from ``proto/batchpipe/v1``; regenerate with
``make proto``) is imported by :mod:`worker.wire.codec` only: everything else works with
the frozen dataclasses of :mod:`worker.wire.messages`.
"""
