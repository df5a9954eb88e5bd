"""The progress record's bytes: protobuf ``batchpipe.v1.PartitionProgress``
(``proto/batchpipe/v1/progress.proto``), for :mod:`worker.kafka.progress`.

Decoding refuses what is not a record of the asking group and partition, or breaks
:class:`batcher.Progress`'s invariants, so that nothing but a well-formed record of its
own partition can make a worker skip a record.
"""

from __future__ import annotations

from itertools import pairwise

from google.protobuf.message import DecodeError

from batcher import Partition, Progress
from worker.wire._generated.batchpipe.v1.progress_pb2 import PartitionProgress

CONTENT_TYPE = "application/x-protobuf; type=batchpipe.v1.PartitionProgress"
#: the largest progress record read back; a record holds at most two prefetch windows of
#: unanswered offsets (a few KiB), so anything larger is not one of ours
MAX_RECORD_BYTES = 4 * 1024 * 1024


def encode_progress(group: str, origin: Partition, progress: Progress) -> bytes:
    base = progress.committed
    message = PartitionProgress(
        group=group,
        topic=origin[0],
        partition=origin[1],
        committed=base,
        highest=progress.highest,
        unanswered=[o - base for o in progress.unanswered],
    )
    return message.SerializeToString()


def decode_progress(group: str, origin: Partition, value: bytes | None) -> Progress | None:
    """What ``value`` says of ``origin``; None when it is not a record of this group and
    partition, or does not keep :class:`Progress`'s invariants."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        return None
    message = PartitionProgress()
    try:
        message.ParseFromString(value)
    except DecodeError:
        return None
    if (message.group, message.topic, message.partition) != (group, origin[0], origin[1]):
        return None
    base = message.committed
    unanswered = tuple(base + d for d in message.unanswered)
    if base < 0 or any(b <= a for a, b in pairwise(unanswered)):
        return None
    if unanswered and unanswered[-1] >= message.highest:
        return None
    return Progress(base, message.highest, unanswered)
