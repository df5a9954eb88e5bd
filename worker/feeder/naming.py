"""The feeder's topics and the headers publishers put on pending records (§10).

A requests topic ``T`` has, when ``scheduling.fair`` is on, a pending topic ``T.pending``
(one partition: one feeder at a time moves it) and the feeder's compacted state topic
``T.feeder-state``. Publishers (``submit``, :class:`batchpipe.Client`, ``serve``) write
every record of a batch to the pending topic with the headers the feeder schedules by,
so that it never decodes a request: its batch id, its key (whose share it takes), its
batch's weight and the record's estimated tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.config import KafkaConfig, LimitsConfig, producer_max_bytes
from worker.kafka import clients

BATCH_HEADER = "batchpipe-batch-id"
WEIGHT_HEADER = "batchpipe-weight"
KEY_HEADER = "batchpipe-key"
TOKENS_HEADER = "batchpipe-tokens"
#: the most one batch may weigh against another: a bound on how unfair a weight can be
MAX_WEIGHT = 1000.0

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


def pending_topic(requests_topic: str) -> str:
    return f"{requests_topic}.pending"


def state_topic(requests_topic: str) -> str:
    return f"{requests_topic}.feeder-state"


def ensure_pending(kafka: KafkaConfig, limits: LimitsConfig, requests_topics: list[str]) -> None:
    """Create the pending topics of ``requests_topics`` that are missing, whoever comes
    first (publisher or worker): one partition (one feeder moves it, in order), the
    producers' record limit (a batch's largest line fits), and kept forever (an unfed
    record is never deleted by the cluster's default retention)."""
    clients.ensure_topics(
        kafka,
        [pending_topic(t) for t in requests_topics],
        partitions=1,
        max_message_bytes=producer_max_bytes(kafka, limits),
        retain_forever=True,
    )


def check_weight(weight: float) -> float:
    """``weight`` if it can be a batch's weight; ``ValueError`` naming the bound otherwise."""
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValueError(f"weight must be > 0 and at most {MAX_WEIGHT:g}, got {weight!r}")
    return weight


def pending_headers(batch_id: str, weight: float, key: str = "") -> list[tuple[str, bytes]]:
    """The headers every record of a batch carries (:func:`tokens_header` is per record)."""
    return [
        (BATCH_HEADER, batch_id.encode()),
        (WEIGHT_HEADER, repr(float(weight)).encode()),
        (KEY_HEADER, key.encode()),
    ]


def tokens_header(tokens: int) -> tuple[str, bytes]:
    return (TOKENS_HEADER, str(tokens).encode())


@dataclass(frozen=True)
class Scheduled:
    """What the feeder reads of a pending record: whose it is, and what it costs."""

    batch_id: str = ""
    weight: float = 1.0
    key: str = ""
    tokens: int = 1


def scheduled_as(headers: Headers | None) -> Scheduled:
    """How a pending record is scheduled. A record without the headers (a producer outside
    batchpipe) is a batch of its own kind, ``""``, of weight 1, key ``""`` and one token; a
    weight or token count that is not a number in range counts as 1 rather than stopping
    the feeder."""
    batch_id, weight, key, tokens = "", 1.0, "", 1
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        raw = value.decode("utf-8", "replace") if isinstance(value, bytes) else value or ""
        if name == BATCH_HEADER:
            batch_id = raw
        elif name == KEY_HEADER:
            key = raw
        elif name == WEIGHT_HEADER:
            try:
                weight = check_weight(float(raw))
            except ValueError:
                weight = 1.0
        elif name == TOKENS_HEADER:
            tokens = int(raw) if raw.isdigit() and int(raw) > 0 else 1
    return Scheduled(batch_id, weight, key, tokens)
