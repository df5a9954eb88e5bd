"""Seals: how a publisher without fair share tells the workers its batch is whole (§7).

With ``scheduling.fair: false`` a publisher writes a batch's requests straight to the
requests topic, without a transaction (an idempotent producer: in order, none twice), each
with the header :data:`SEAL_HEADER`. No transaction means nothing it does, killed or
racing another publisher, can move a partition's last stable offset: no publisher hides
another batch. Whole-or-nothing moves to the control topic, which every worker reads in
full (:mod:`worker.kafka.cancellations`), in one record per batch, key ``seal:<batch id>``:

* ``open`` before the first request, and again at least every :data:`ALIVE_S` while it
  publishes: a sign of life;
* ``sealed``, with the count, once every request was acknowledged: the batch is whole;
* ``void`` when its publish failed, or when it went :data:`SEAL_HOLD_S` or more without a
  sign (a stalled publisher gives its batch up rather than seal a batch that workers may
  have given up).

A worker holds the requests of a batch with the header until its ``sealed`` record, and
answers them 4009 ``publish_incomplete`` without running them on ``void``, or when it has
read no sign of the batch for :data:`GIVE_UP_S` (by its own clock, from when it read the
newest one: no clock of the publisher's is trusted). A live publisher signs well inside
that, so workers give a batch up only when its publisher stopped: :data:`SKEW_S` is the
margin for a sign read late. The key is compacted to the last record: ``sealed`` or
``void`` for good, or the last ``open`` of a publisher that died (a worker reading it
later gives that batch up :data:`GIVE_UP_S` after reading it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from worker.wire.codec import Headers

#: on a request published without fair share: held until its batch's seal
SEAL_HEADER = "batchpipe-seal"
SEAL_VALUE = b"control"
#: a publisher writes an ``open`` sign at least this often while it publishes
ALIVE_S = 5.0
#: a publisher that went this long without a sign voids its batch instead of sealing it
SEAL_HOLD_S = 20.0
#: a worker's margin beyond :data:`SEAL_HOLD_S` for a sign delivered or read late
SKEW_S = 10.0
#: a worker gives a batch up this long after it read the newest sign of it
GIVE_UP_S = SEAL_HOLD_S + SKEW_S
#: the longest batch id a seal names (a batch id is far shorter; anyone who can write the
#: control topic writes seals)
MAX_BATCH_ID = 256
_KEY_PREFIX = "seal:"

State = Literal["open", "sealed", "void"]
_STATES: frozenset[str] = frozenset(("open", "sealed", "void"))


@dataclass(frozen=True)
class Seal:
    """One sign of a batch published without fair share: ``open`` (publishing),
    ``sealed`` (every one of its ``count`` requests acknowledged) or ``void``."""

    batch_id: str
    state: State
    at: float
    count: int = 0

    @property
    def key(self) -> bytes:
        return (_KEY_PREFIX + self.batch_id).encode()

    def encode(self) -> bytes:
        doc = {"seal": self.state, "batch_id": self.batch_id, "at": self.at, "count": self.count}
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, value: bytes) -> Seal:
        """Raises ``ValueError`` for a value that is not a seal."""
        try:
            doc = json.loads(value)
        except RecursionError as exc:
            raise ValueError("a seal nested too deep") from exc
        if not isinstance(doc, dict):
            raise ValueError("a seal is a JSON object")
        state, batch_id = doc.get("seal"), doc.get("batch_id")
        at, count = doc.get("at"), doc.get("count", 0)
        if state not in _STATES:
            raise ValueError(f"unknown seal state {state!r}")
        if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID:
            raise ValueError("a seal names its batch_id")
        if not isinstance(at, int | float) or isinstance(at, bool):
            raise ValueError("a seal carries its time 'at'")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError("a seal's count is a whole number")
        return cls(batch_id, state, float(at), count)


def is_seal(value: bytes) -> bool:
    """Whether a control record is a seal rather than a stop (seals start so)."""
    return value.startswith(b'{"seal"')


def sealed_by_control(headers: Headers | None) -> bool:
    """Whether a request waits for its batch's seal (:data:`SEAL_HEADER`)."""
    if not headers:
        return False
    if isinstance(headers, Mapping):
        return _is_seal_value(headers.get(SEAL_HEADER))
    return any(name == SEAL_HEADER and _is_seal_value(v) for name, v in headers)


def _is_seal_value(value: object) -> bool:
    return value == SEAL_VALUE or value == SEAL_VALUE.decode()
