"""The feeder's topics and the headers publishers put on pending records (§10).

A requests topic ``T`` has, when ``scheduling.fair`` is on, a pending topic ``T.pending``
(one partition: one feeder at a time moves it) and the feeder's compacted state topic
``T.feeder-state``. Publishers (``submit``, :class:`batchpipe.Client`, ``serve``) write
every record of a batch to the pending topic with two headers the feeder schedules by,
so that it never decodes a request: its batch id and its batch's weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

BATCH_HEADER = "batchpipe-batch-id"
WEIGHT_HEADER = "batchpipe-weight"
#: the most one batch may weigh against another: a bound on how unfair a weight can be
MAX_WEIGHT = 1000.0

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


def pending_topic(requests_topic: str) -> str:
    return f"{requests_topic}.pending"


def state_topic(requests_topic: str) -> str:
    return f"{requests_topic}.feeder-state"


def check_weight(weight: float) -> float:
    """``weight`` if it can be a batch's weight; ``ValueError`` naming the bound otherwise."""
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValueError(f"weight must be > 0 and at most {MAX_WEIGHT:g}, got {weight!r}")
    return weight


def pending_headers(batch_id: str, weight: float) -> list[tuple[str, bytes]]:
    return [(BATCH_HEADER, batch_id.encode()), (WEIGHT_HEADER, repr(float(weight)).encode())]


def scheduled_as(headers: Headers | None) -> tuple[str, float]:
    """(batch id, weight) of a pending record. A record without them (a producer outside
    batchpipe) is a batch of its own kind, ``""``, of weight 1; a weight that is not a
    number in range counts as 1 rather than stopping the feeder."""
    batch_id, weight = "", 1.0
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        raw = value.decode("utf-8", "replace") if isinstance(value, bytes) else value or ""
        if key == BATCH_HEADER:
            batch_id = raw
        elif key == WEIGHT_HEADER:
            try:
                weight = check_weight(float(raw))
            except ValueError:
                weight = 1.0
    return batch_id, weight
