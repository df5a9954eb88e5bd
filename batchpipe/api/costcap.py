"""A cost cap per batch under ``batchpipe serve`` (docs/architecture.md §11, docs/api.md).

A batch is capped in tokens (prompt + completion, as the workers count them) with the
metadata pair ``batchpipe_max_tokens`` (a whole number in [1, 10¹²]) and, where its model
has a price (``api.prices``: USD per 1,000,000 prompt and completion tokens), in money
with ``batchpipe_max_cost_usd`` (a number in (0, 1,000,000]). A key may have a default cap
of each kind (``api.key_max_tokens``, ``api.key_max_cost_usd``: its owner, or ``"*"``).
The key's cap is also the most its batches may ask for: a batch may lower it, never raise
it, as with ``batchpipe_weight`` (:mod:`batchpipe.api.weights`) — the operator's cap on a
tenant's spend holds for every batch, and a tenant can still cap one batch tighter.

A cap that cannot be read (not a number, 0 or less, over the bound or the key's cap, a
cost cap for a model without a price) is a 400 naming the metadata key, nothing stored.
A key whose batches carry a default cost cap cannot run a model without a price: the
operator asked for money to be counted, and it cannot be; such a batch is a 400 naming
``input_file_id`` (``model_not_priced``).

The cap and the model's prices are resolved once, at create, and kept in the batch
record (:class:`~batchpipe.caps.Cap`): a change of configuration later never moves a
running batch's cap or the price its spend is counted at. How a cap is read, bounded and
counted is :mod:`batchpipe.caps`, shared with ``batchpipe run`` and the Python client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchpipe.caps import (
    MAX_COST_METADATA,
    MAX_TOKENS_METADATA,
    Cap,
    CapError,
    read_cost,
    read_tokens,
)
from worker.config import Config

__all__ = ["MAX_COST_METADATA", "MAX_TOKENS_METADATA", "Cap", "CapError", "batch_cap"]

ANY_KEY = "*"


def _of_key(caps: Mapping[str, Any], owner: str) -> Any:
    return caps.get(owner, caps.get(ANY_KEY))


def batch_cap(config: Config, owner: str, model: str, metadata: Mapping[str, str]) -> Cap:
    """The caps of ``owner``'s new batch of ``model``; :class:`CapError` naming the field
    when one cannot be read."""
    api = config.api
    price = api.prices.get(model)
    key_tokens = _of_key(api.key_max_tokens, owner)
    key_cost = _of_key(api.key_max_cost_usd, owner)
    return Cap(
        max_tokens=read_tokens(
            metadata.get(MAX_TOKENS_METADATA), None if key_tokens is None else int(key_tokens)
        ),
        max_cost_usd=read_cost(metadata.get(MAX_COST_METADATA), key_cost, price is not None, model),
        prompt_per_1m=None if price is None else float(price["prompt_per_1m"]),
        completion_per_1m=None if price is None else float(price["completion_per_1m"]),
    )
