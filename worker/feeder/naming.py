"""The feeder's topics and the headers publishers put on pending records (§10).

A requests topic ``T`` has, when ``scheduling.fair`` is on, a pending topic ``T.pending``
(one partition: one feeder at a time moves it) and the feeder's compacted state topic
``T.feeder-state``. Publishers (``submit``, :class:`batchpipe.Client`, ``serve``) write
every record of a batch to the pending topic with the headers the feeder schedules by,
so that it never decodes a request: its batch id, its key (whose share it takes), its
batch's weight and deadline, and the record's estimated tokens. The feeder reads them with a bound
(:mod:`worker.feeder.headers`).
"""

from __future__ import annotations

import math
import time

from batcher.fairshare import MAX_WEIGHT, MIN_WEIGHT
from batcher.tiers import DEFAULT, TIERS
from worker.config import KafkaConfig, LimitsConfig, producer_max_bytes
from worker.feeder.headers import (
    ALIVE_HEADER,
    BATCH_HEADER,
    DEADLINE_HEADER,
    END_HEADER,
    KEY_HEADER,
    SEALED_HEADER,
    TIER_HEADER,
    TOKENS_HEADER,
    WEIGHT_HEADER,
)
from worker.kafka import clients

#: a batch's completion window: serve accepts only "24h", and status, list and collect
#: call a batch expired 24 h after it was submitted (batchpipe.client
#: DEFAULT_COMPLETION_WINDOW_S)
COMPLETION_WINDOW_S = 24 * 3600.0
#: a sealed batch with neither a record nor a heartbeat written for this long and no end
#: marker is one whose publisher died: the feeder gives it up and ``status`` reports it
#: failed (a live publisher writes a heartbeat after :data:`ALIVE_S` without a record, and
#: a record it wrote is acknowledged within 30 s or its publish fails)
HOLD_S = 60.0
#: a publisher writing a sealed batch writes a heartbeat when it wrote nothing this long
ALIVE_S = 5.0


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
    """``weight`` if it can be a batch's weight; ``ValueError`` naming the bounds otherwise
    (a publisher refuses what the feeder would clamp: nothing is changed silently)."""
    if not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise ValueError(
            f"weight must be at least {MIN_WEIGHT:g} and at most {MAX_WEIGHT:g}, got {weight!r}"
        )
    return weight


def pending_headers(
    batch_id: str,
    weight: float,
    key: str = "",
    *,
    sealed: bool = False,
    deadline: float | None = None,
    tier: str = DEFAULT,
) -> list[tuple[str, bytes]]:
    """The headers every record of a batch carries (:func:`tokens_header` is per record);
    ``sealed``: the batch ends with :func:`end_marker` and is held until it is read;
    ``deadline`` (wall-clock seconds) defaults to now + :data:`COMPLETION_WINDOW_S`;
    ``tier`` other than ``default`` is written (:func:`check_tier` first)."""
    if deadline is None:
        deadline = time.time() + COMPLETION_WINDOW_S
    headers = [
        (BATCH_HEADER, batch_id.encode()),
        (WEIGHT_HEADER, repr(float(weight)).encode()),
        (KEY_HEADER, key.encode()),
        (DEADLINE_HEADER, repr(float(deadline)).encode()),
    ]
    if tier != DEFAULT:
        headers.append((TIER_HEADER, check_tier(tier).encode()))
    return [*headers, (SEALED_HEADER, b"1")] if sealed else headers


def check_tier(tier: str) -> str:
    """``tier`` if it names a service tier, else ``ValueError`` naming the three."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier[:40]!r}")
    return tier


def end_marker(batch_id: str, weight: float, key: str, count: int) -> list[tuple[str, bytes]]:
    """The headers of a sealed batch's last record (no value): its ``count`` records are
    all published and acknowledged, and the feeder feeds it only once it has read as many
    (docs/architecture.md §10, "Publish without transactions")."""
    return [*pending_headers(batch_id, weight, key), (END_HEADER, str(count).encode())]


def alive_marker(batch_id: str) -> list[tuple[str, bytes]]:
    """The headers of a publisher's heartbeat (no value): it is still publishing
    ``batch_id``, slowly; the feeder gives a sealed batch up only after ``HOLD_S`` with
    neither a record nor a heartbeat of it."""
    return [(BATCH_HEADER, batch_id.encode()), (ALIVE_HEADER, b"1")]


def tokens_header(tokens: int) -> tuple[str, bytes]:
    return (TOKENS_HEADER, str(tokens).encode())
