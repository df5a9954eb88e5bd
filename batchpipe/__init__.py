"""batchpipe: Kafka-driven streaming batch inference for LLMs.

The public face is :class:`Client` (submit a batch, follow it, collect its results)
and the ``batchpipe`` command line, which uses the same client. Every exception batchpipe
raises derives from :class:`BatchpipeError`.
"""

from __future__ import annotations

from batcher.tiers import TierRefusedError
from batchpipe.batchfile import BatchFileError, FileLimits, LineProblem
from batchpipe.caps import CapError
from batchpipe.client import (
    BatchNotFoundError,
    BatchStatus,
    Client,
    CollectTimeoutError,
    PublishIncompleteError,
    SubmitReceipt,
)
from worker.errors import BatchpipeError

__all__ = [
    "BatchFileError",
    "BatchNotFoundError",
    "BatchStatus",
    "BatchpipeError",
    "CapError",
    "Client",
    "CollectTimeoutError",
    "FileLimits",
    "LineProblem",
    "PublishIncompleteError",
    "SubmitReceipt",
    "TierRefusedError",
]
