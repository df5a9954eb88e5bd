"""Pure batching core: limits, formation, admission, adaptive size, dedup, offset tracking.

No Kafka, no engine, no threads, no clock: time is passed in by the caller.
"""

from __future__ import annotations

from batcher.adaptive import AdaptiveBatchSize
from batcher.admission import Admission
from batcher.batcher import DynamicBatcher
from batcher.formation import PREFIX_BLOCK_TOKENS, length_distance, prefix_key_of, select
from batcher.offsets import OffsetTracker, Progress
from batcher.types import Batch, BatchLimits, Partition, Pending, Reason

__all__ = [
    "PREFIX_BLOCK_TOKENS",
    "AdaptiveBatchSize",
    "Admission",
    "Batch",
    "BatchLimits",
    "DynamicBatcher",
    "OffsetTracker",
    "Partition",
    "Pending",
    "Progress",
    "Reason",
    "length_distance",
    "prefix_key_of",
    "select",
]
