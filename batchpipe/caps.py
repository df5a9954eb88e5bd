"""A batch's caps: read, bounded, counted and stopped at (docs/architecture.md §12).

A batch may be capped in tokens (prompt + completion, as the workers count them: a whole
number in [1, 10¹²]) and, where its model has a price (``api.prices``: USD per 1,000,000
prompt and completion tokens), in money (a number in (0, 1,000,000]). ``batchpipe serve``
reads them from a batch's metadata (:mod:`batchpipe.api.costcap`, which adds each key's
default); ``batchpipe run`` and :meth:`batchpipe.client.Client.collect` take them as
options (:func:`given_cap`). Either way the spend is the sum of the answers' usage
(:meth:`Cap.reached`), and a batch at its cap is stopped with one ``capped`` record on
the control topic: the workers and the feeder answer every line not run yet 4008
``batch_cap_reached`` (:mod:`worker.kafka.cancellations`). :class:`CapWatch` is that
stop for a batch followed without serve, by whoever collects its answers.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from worker.errors import BatchpipeError
from worker.kafka.cancellations import Stop

MAX_TOKENS_METADATA = "batchpipe_max_tokens"
MAX_COST_METADATA = "batchpipe_max_cost_usd"
#: the largest caps a batch may carry: beyond any batch serve takes, so a larger one is a
#: mistake (a unit slip), not a cap
MAX_CAP_TOKENS = 10**12
MAX_CAP_USD = 1_000_000.0
#: ``errors.data[].code`` of a batch stopped at its cap (its lines: 4008)
CAP_CODE = "batch_cap_reached"
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


def read_tokens(
    raw: str | None, ceiling: int | None, param: str = f"metadata.{MAX_TOKENS_METADATA}"
) -> int | None:
    if raw is None:
        return ceiling
    bound = MAX_CAP_TOKENS if ceiling is None else ceiling
    value = int(raw) if _WHOLE.fullmatch(raw) else 0
    if not 1 <= value <= bound:
        whose = "this key's cap" if ceiling is not None else "the bound"
        raise CapError(
            f"{param}: must be a whole number of tokens (prompt + "
            f"completion) from 1 to {bound} ({whose}), got {raw[:40]!r}",
            param,
        )
    return value


def read_cost(
    raw: str | None,
    ceiling: float | None,
    priced: bool,
    model: str,
    names: tuple[str, str] = (f"metadata.{MAX_COST_METADATA}", MAX_TOKENS_METADATA),
) -> float | None:
    """A cost cap of ``model`` priced or not (``priced``) under the key's ``ceiling``;
    ``names``: the field read, and the one a token cap is asked with."""
    param, tokens_name = names
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
            f"be counted; cap the batch in tokens with {tokens_name}",
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


def given_cap(
    max_tokens: object,
    max_cost_usd: object,
    model: str | None,
    prices: Mapping[str, Mapping[str, float]],
    names: tuple[str, str] = ("max_tokens", "max_cost_usd"),
) -> Cap:
    """The caps a batch collected without serve is followed under (``batchpipe run``,
    :meth:`batchpipe.client.Client.collect`), read and bounded as serve's metadata is but
    without a key's default (no key is known there); ``names`` are the fields they came
    from, named in a :class:`CapError`. ``model`` prices the cost: None when the batch
    holds several models (a cost cap is refused then, as for a model without a price)."""
    tokens_name, cost_name = names
    price = None if model is None else prices.get(model)
    return Cap(
        max_tokens=read_tokens(None if max_tokens is None else str(max_tokens), None, tokens_name),
        max_cost_usd=read_cost(
            None if max_cost_usd is None else str(max_cost_usd),
            None,
            price is not None,
            "(several models)" if model is None else model,
            (cost_name, tokens_name),
        ),
        prompt_per_1m=None if price is None else float(price["prompt_per_1m"]),
        completion_per_1m=None if price is None else float(price["completion_per_1m"]),
    )


class Followed(Spent, Protocol):
    """A batch's answers counted so far (a :class:`~batchpipe.collect.BatchTally`)."""

    batch_id: str

    @property
    def complete(self) -> bool: ...


class CapWatch:
    """Counts a batch's spend as its answers are collected and, the first time it reaches
    its cap while lines are still to come, announces the batch's ``capped`` stop (once):
    the collector keeps reading, and the lines not run arrive as 4008. ``announce``
    publishes a stop (:meth:`worker.kafka.cancellations.Announcer.announce`)."""

    def __init__(self, cap: Cap, announce: Callable[[Stop], None]) -> None:
        self.cap = cap
        self._announce = announce
        #: the field of the cap reached (:meth:`Cap.reached`), None while under it
        self.reached: str | None = None

    def see(self, tally: Followed) -> None:
        if self.reached is not None or tally.complete:
            return
        self.reached = self.cap.reached(tally)
        if self.reached is not None:
            self._announce(Stop(tally.batch_id, "capped", time.time()))

    def summary(self, spent: Spent) -> str | None:
        """Which cap stopped the batch and at what spend; None when none did."""
        if self.reached is None:
            return None
        return str(self.cap.error(self.reached, spent)["message"])
