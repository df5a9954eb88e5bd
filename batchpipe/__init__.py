"""batchpipe: Kafka-driven streaming batch inference for LLMs.

The public face is :class:`Client` (submit a batch, follow it, collect its results)
and the ``batchpipe`` command line, which uses the same client.
"""

from __future__ import annotations

from batchpipe.batchfile import BatchFileError, BatchLimits, LineProblem
from batchpipe.client import (
    BatchNotFoundError,
    BatchStatus,
    Client,
    CollectTimeoutError,
    SubmitReceipt,
)

__all__ = [
    "BatchFileError",
    "BatchLimits",
    "BatchNotFoundError",
    "BatchStatus",
    "Client",
    "CollectTimeoutError",
    "LineProblem",
    "SubmitReceipt",
]
