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
record (:class:`Cap`): a change of configuration later never moves a running batch's
cap or the price its spend is counted at.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from worker.config import Config
from worker.errors import BatchpipeError

MAX_TOKENS_METADATA = "batchpipe_max_tokens"
MAX_COST_METADATA = "batchpipe_max_cost_usd"
#: the largest caps a batch may carry: beyond any batch serve takes, so a larger one is a
#: mistake (a unit slip), not a cap
MAX_CAP_TOKENS = 10**12
MAX_CAP_USD = 1_000_000.0
#: ``errors.data[].code`` of a batch stopped at its cap (its lines: 4008)
CAP_CODE = "batch_cap_reached"
ANY_KEY = "*"
_WHOLE = re.compile(r"[0-9]{1,13}")


class CapError(BatchpipeError, ValueError):
    """A cap that cannot be read; ``param`` names the field, ``error_code`` the OpenAI code."""

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.error_code = code


class Spent(Protocol):
    """What a batch has spent so far (a :class:`~batchpipe.collect.BatchTally`)."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Cap:
    """A batch's caps and the prices its cost is counted at (USD per 1,000,000 tokens;
    None: its model has no price); ``reached_at``: when serve stopped it at a cap."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    prompt_per_1m: float | None = None
    completion_per_1m: float | None = None
    reached_at: int | None = None

    @property
    def limits(self) -> bool:
        return self.max_tokens is not None or self.max_cost_usd is not None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self.prompt_per_1m is None or self.completion_per_1m is None:
            return None
        return (
            prompt_tokens * self.prompt_per_1m + completion_tokens * self.completion_per_1m
        ) / 1_000_000

    def reached(self, spent: Spent) -> str | None:
        """The metadata key of the cap ``spent`` has reached, None while under both."""
        tokens = spent.prompt_tokens + spent.completion_tokens
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"metadata.{MAX_TOKENS_METADATA}"
        cost = self.cost(spent.prompt_tokens, spent.completion_tokens)
        if self.max_cost_usd is not None and cost is not None and cost >= self.max_cost_usd:
            return f"metadata.{MAX_COST_METADATA}"
        return None

    def error(self, param: str, spent: Spent) -> dict[str, Any]:
        """The batch's ``errors.data`` entry saying which cap stopped it, at what spend."""
        tokens = spent.prompt_tokens + spent.completion_tokens
        if param.endswith(MAX_TOKENS_METADATA):
            what = f"its token cap of {self.max_tokens:,} ({tokens:,} tokens spent)"
        else:
            cost = self.cost(spent.prompt_tokens, spent.completion_tokens) or 0.0
            what = f"its cost cap of {self.max_cost_usd:g} USD ({cost:.4f} USD spent)"
        message = (
            f"the batch reached {what}; the lines not run are in the error file "
            "with code 4008 batch_cap_reached"
        )
        return {"code": CAP_CODE, "message": message, "param": param, "line": None}

    def view(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The batch object's ``batchpipe.spend``: what it spent against its caps."""
        cost = self.cost(prompt_tokens, completion_tokens)
        return {
            "tokens": prompt_tokens + completion_tokens,
            "cost_usd": None if cost is None else round(cost, 6),
            "max_tokens": self.max_tokens,
            "max_cost_usd": self.max_cost_usd,
            "cap_reached_at": self.reached_at,
        }

    def encode(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Cap:
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})

    def stopped(self, at: int) -> Cap:
        return replace(self, reached_at=at)


def _of_key(caps: Mapping[str, Any], owner: str) -> Any:
    return caps.get(owner, caps.get(ANY_KEY))


def _tokens(raw: str | None, ceiling: int | None) -> int | None:
    if raw is None:
        return ceiling
    bound = MAX_CAP_TOKENS if ceiling is None else ceiling
    value = int(raw) if _WHOLE.fullmatch(raw) else 0
    if not 1 <= value <= bound:
        whose = "this key's cap" if ceiling is not None else "the bound"
        raise CapError(
            f"metadata.{MAX_TOKENS_METADATA}: must be a whole number of tokens (prompt + "
            f"completion) from 1 to {bound} ({whose}), got {raw[:40]!r}",
            f"metadata.{MAX_TOKENS_METADATA}",
        )
    return value


def _cost(raw: str | None, ceiling: float | None, priced: bool, model: str) -> float | None:
    param = f"metadata.{MAX_COST_METADATA}"
    if raw is None:
        if ceiling is not None and not priced:
            raise CapError(
                f"input_file_id: this key's batches are capped at {ceiling:g} USD "
                f"(api.key_max_cost_usd), but model {model[:80]!r} has no price in "
                "api.prices, so its cost cannot be counted",
                "input_file_id",
                "model_not_priced",
            )
        return None if ceiling is None else float(ceiling)
    if not priced:
        raise CapError(
            f"{param}: model {model[:80]!r} has no price in api.prices, so its cost cannot "
            f"be counted; cap the batch in tokens with {MAX_TOKENS_METADATA}",
            param,
        )
    bound = MAX_CAP_USD if ceiling is None else float(ceiling)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= bound):
        whose = "this key's cap" if ceiling is not None else "the bound"
        raise CapError(
            f"{param}: must be a number of US dollars above 0 and at most {bound:g} "
            f"({whose}), got {raw[:40]!r}",
            param,
        )
    return value


def batch_cap(config: Config, owner: str, model: str, metadata: Mapping[str, str]) -> Cap:
    """The caps of ``owner``'s new batch of ``model``; :class:`CapError` naming the field
    when one cannot be read."""
    api = config.api
    price = api.prices.get(model)
    key_tokens = _of_key(api.key_max_tokens, owner)
    key_cost = _of_key(api.key_max_cost_usd, owner)
    return Cap(
        max_tokens=_tokens(
            metadata.get(MAX_TOKENS_METADATA), None if key_tokens is None else int(key_tokens)
        ),
        max_cost_usd=_cost(metadata.get(MAX_COST_METADATA), key_cost, price is not None, model),
        prompt_per_1m=None if price is None else float(price["prompt_per_1m"]),
        completion_per_1m=None if price is None else float(price["completion_per_1m"]),
    )
