"""A batch's fair-share weight under ``batchpipe serve`` (docs/architecture.md §10).

A key's batches weigh ``api.key_weights[owner]``, or ``scheduling.weight`` for an owner
not named there (both within [0.001, 1000], checked with the configuration). A batch may
ask for less with the metadata pair ``batchpipe_weight`` (a number in [0.001, the key's
weight]): a tenant can run a background batch below its own interactive work, but never
above what the operator gave its key, so no key outweighs its configured share by
splitting or labelling its work.

A weight below the floor (``1e-308``, ``5e-324``: a tenant's way to overflow the fair
share, issue 38) is refused at create with a 400 naming ``metadata.batchpipe_weight``,
never clamped in silence; the feeder clamps again whatever reaches it
(:mod:`worker.feeder.headers`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from batcher.fairshare import MIN_WEIGHT
from worker.config import Config

WEIGHT_METADATA = "batchpipe_weight"


def key_weight(config: Config, owner: str) -> float:
    return float(config.api.key_weights.get(owner, config.scheduling.weight))


def batch_weight(config: Config, owner: str, metadata: Mapping[str, str]) -> float:
    """The weight of ``owner``'s batch; ``ValueError`` naming the metadata key and the
    bounds when ``batchpipe_weight`` is not a number in [MIN_WEIGHT, the key's weight]."""
    ceiling = key_weight(config, owner)
    raw = metadata.get(WEIGHT_METADATA)
    if raw is None:
        return ceiling
    try:
        weight = float(raw)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and MIN_WEIGHT <= weight <= ceiling):
        raise ValueError(
            f"metadata.{WEIGHT_METADATA}: must be a number at least {MIN_WEIGHT:g} and at "
            f"most this key's weight {ceiling:g}, got {raw[:40]!r}"
        )
    return weight


def published_weight(config: Config, owner: str, metadata: Mapping[str, str]) -> float:
    """The weight a created batch is published with: as checked at create, or the key's
    weight if the operator lowered it since (the ceiling holds at publication too)."""
    try:
        return batch_weight(config, owner, metadata)
    except ValueError:
        return key_weight(config, owner)
