"""A batch's service tier under ``batchpipe serve`` (docs/api.md "Service tiers").

A batch asks for one with the metadata pair ``batchpipe_tier``: ``"priority"`` (fed ahead
of the default tier within its key's allowance, ``scheduling.priority_shares``),
``"default"`` (what a batch without the pair gets) or ``"flex"`` (fed only from capacity
no other batch wants). Any other value is refused at create with a 400 naming
``metadata.batchpipe_tier``: a typo must not leave a batch in a tier its owner did not
ask for. So is ``"priority"`` from a key whose allowance is 0: ``priority_shares`` of the
batch's owner (the key the feeder shares by), else ``"*"``
(:func:`batcher.tiers.check_allowance`); none of its batches would ever be fed ahead. The
tier is published with every record (:mod:`worker.feeder.naming`) and shown in the batch
object (``batchpipe_tier``), the console and ``batchpipe status``/``list``.
"""

from __future__ import annotations

from collections.abc import Mapping

from batcher.tiers import DEFAULT, TIERS, check_allowance
from worker.config import Config

TIER_METADATA = "batchpipe_tier"


def batch_tier(config: Config, owner: str, metadata: Mapping[str, str]) -> str:
    """The tier ``owner``'s batch asks for in its metadata; ``ValueError`` naming the
    metadata key and the three tiers for anything else, and
    :class:`~batcher.tiers.TierRefusedError` (a ``ValueError``) naming it and the
    allowance for ``priority`` from a key whose allowance is 0."""
    raw = metadata.get(TIER_METADATA)
    if raw is None:
        return DEFAULT
    if raw not in TIERS:
        raise ValueError(
            f"metadata.{TIER_METADATA}: must be one of {', '.join(TIERS)}, got {raw[:40]!r}"
        )
    shares = config.scheduling.priority_shares
    return check_allowance(raw, shares, owner, f"metadata.{TIER_METADATA}")


def published_tier(config: Config, owner: str, metadata: Mapping[str, str]) -> str:
    """The tier a created batch is published in: as shown, but
    :class:`~batcher.tiers.TierRefusedError` naming ``metadata.batchpipe_tier`` if its key's
    allowance was set to 0 since (the batch then fails; it never runs as default)."""
    shares = config.scheduling.priority_shares
    return check_allowance(shown_tier(metadata), shares, owner, f"metadata.{TIER_METADATA}")


def shown_tier(metadata: Mapping[str, str]) -> str:
    """The tier a created batch runs in (a refused value never gets this far)."""
    raw = metadata.get(TIER_METADATA, DEFAULT)
    return raw if raw in TIERS else DEFAULT
