"""What the feeder reads of a pending record, parsed with a bound (docs/architecture.md §10).

Anyone who can write to the pending topic writes these headers, so nothing in them may
stop the feeder or buy a share: every value is parsed from at most :data:`MAX_NUMBER_CHARS`
characters, a weight is clamped to the fair share's bounds, and a ``tokens`` value is
bounded by what the record's own size allows (issue 38: a 4,300-digit ``tokens`` raised
``ValueError``, ``10**400`` overflowed the fair share, ``tokens=1`` was charged 1/700 of a
real request).

*Charging.* A request is charged its ``tokens`` header, kept within
``[content ÷ (4 × CHARS_PER_TOKEN), content + max_batch_tokens]``, where *content* is the
record's value as the worker will decode it: the size a zstd frame declares (the cap,
``limits.max_decompressed_bytes``, when it declares none), else the value's length. The
ceiling: a prompt is at most one token a byte, and a request whose prompt + ``max_tokens``
exceeds ``max_batch_tokens`` is refused without running. The floor: a quarter of the
prompt estimate the record's size implies (a line's other fields — custom_id, a schema —
are counted generously), so a publisher that writes ``tokens=1`` under-pays at most 16×,
not 700×. A record without the header (a producer outside batchpipe) is charged the
feeder's own estimate: ``content ÷ CHARS_PER_TOKEN`` + ``generation.max_tokens``, the same
estimate publishers write, with the whole value counted as prompt.

A batch id or key longer than :data:`MAX_ID_CHARS` makes the record headerless (batch
``""``): such ids are never written by batchpipe, and one must not cost memory per record.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import zstandard

from batcher.fairshare import MAX_TOKENS, clamp_weight
from batcher.tiers import DEFAULT, tier_of
from worker.config import Config
from worker.feeder.estimate import CHARS_PER_TOKEN
from worker.kafka.consumer import Record
from worker.wire.compression import ZSTD_MAGIC

BATCH_HEADER = "batchpipe-batch-id"
WEIGHT_HEADER = "batchpipe-weight"
KEY_HEADER = "batchpipe-key"
TOKENS_HEADER = "batchpipe-tokens"
#: on each record of a batch that ends with an end marker: hold it until the marker
SEALED_HEADER = "batchpipe-sealed"
#: on the end marker, the batch's last record (no value): the number of its records
END_HEADER = "batchpipe-end"
#: on a publisher's heartbeat (no value): it is still publishing the batch, only slowly
ALIVE_HEADER = "batchpipe-alive"
#: on each record of a batch: its deadline, wall-clock seconds (the publisher's start +
#: the completion window); a batch at risk of missing it is fed earliest deadline first
DEADLINE_HEADER = "batchpipe-deadline"
#: on each record the feeder shares: its key's virtual tag (newcomers first, §10); the
#: worker starts the requests it holds lowest tag first
TAG_HEADER = "batchpipe-tag"
#: on each record of a batch that asked for a service tier other than ``default``:
#: ``priority`` or ``flex`` (batcher/tiers.py); any other value is read as ``default``
TIER_HEADER = "batchpipe-tier"
#: a number header longer than this is not a number (a float's repr is ≤ 24 characters)
MAX_NUMBER_CHARS = 32
#: the longest batch id or key the feeder keeps, in characters
MAX_ID_CHARS = 256
#: the floor of a charge: the record's prompt estimate divided by this
FLOOR_DIVISOR = 4

Headers = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


@dataclass(frozen=True)
class Charging:
    """The limits a charge is bounded by, from the feeding worker's configuration."""

    max_decompressed_bytes: int = 6 * 1024 * 1024
    max_batch_tokens: int = 8192
    default_max_tokens: int = 256

    @classmethod
    def from_config(cls, config: Config) -> Charging:
        return cls(
            config.limits.max_decompressed_bytes,
            config.batching.max_batch_tokens,
            config.generation.max_tokens,
        )

    def content_bytes(self, value: bytes | None) -> int:
        """The bytes the worker will decode from ``value``, read from a zstd frame's header
        without decompressing (at most the cap)."""
        if not value:
            return 0
        if not value.startswith(ZSTD_MAGIC):
            return len(value)
        try:
            size = zstandard.get_frame_parameters(value).content_size
        except zstandard.ZstdError:
            return len(value)  # not a frame: the worker refuses it unrun
        if size == zstandard.CONTENTSIZE_UNKNOWN:
            return self.max_decompressed_bytes
        return min(size, self.max_decompressed_bytes)

    def bounds(self, value: bytes | None) -> tuple[int, int, int]:
        """``(floor, estimate, ceiling)`` of the tokens a record of ``value`` is charged."""
        content = self.content_bytes(value)
        prompt = math.ceil(content / CHARS_PER_TOKEN)
        floor = max(1, prompt // FLOOR_DIVISOR)
        ceiling = min(MAX_TOKENS, content + self.max_batch_tokens)
        estimate = min(ceiling, max(floor, prompt + self.default_max_tokens))
        return floor, estimate, ceiling


@dataclass(frozen=True)
class Scheduled:
    """What the feeder reads of a pending record: whose it is, and what it costs."""

    batch_id: str = ""
    weight: float = 1.0
    key: str = ""
    tokens: int = 1
    sealed: bool = False  # its batch ends with an end marker: held until it is read
    end: bool = False  # this record is that marker, not a request
    deadline: float | None = None  # wall-clock seconds: when its batch's window closes
    #: on an end marker, the number of records it says its batch has (None: not said)
    count: int | None = None
    alive: bool = False  # a publisher's heartbeat, not a request
    tier: str = DEFAULT  # priority, default or flex (batcher/tiers.py)


def scheduled_as(
    headers: Headers | None, value: bytes | None = None, charging: Charging | None = None
) -> Scheduled:
    """How a pending record is scheduled; never raises, whatever the headers and value.

    A record without the headers (a producer outside batchpipe) is a batch of its own
    kind, ``""``, of weight 1 and key ``""``; a weight that is not a number counts as 1,
    one out of range as the nearest bound; tokens as the module doc says.
    """
    charging = charging or Charging()
    raw_batch: str | bytes | None = None
    raw_key: str | bytes | None = None
    raw_weight: str | bytes | None = None
    raw_tokens: str | bytes | None = None
    raw_deadline: str | bytes | None = None
    raw_end: str | bytes | None = None
    raw_tier: str | bytes | None = None
    sealed = end = alive = False
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value_ in pairs:  # the last of each wins; the others are not decoded
        if name == SEALED_HEADER:
            sealed = True
        elif name == END_HEADER:
            end, raw_end = True, value_
        elif name == ALIVE_HEADER:
            alive = True
        elif name == BATCH_HEADER:
            raw_batch = value_
        elif name == KEY_HEADER:
            raw_key = value_
        elif name == WEIGHT_HEADER:
            raw_weight = value_
        elif name == TOKENS_HEADER:
            raw_tokens = value_
        elif name == DEADLINE_HEADER:
            raw_deadline = value_
        elif name == TIER_HEADER:
            raw_tier = value_
    batch_id, key = _text(raw_batch), _text(raw_key)
    if len(batch_id) > MAX_ID_CHARS or len(key) > MAX_ID_CHARS:
        batch_id, key = "", ""
    weight = _weight(raw_weight) if raw_weight is not None else 1.0
    floor, estimate, ceiling = charging.bounds(value)
    tokens = estimate
    digits = _text(raw_tokens) if raw_tokens is not None else ""
    if 0 < len(digits) <= MAX_NUMBER_CHARS and digits.isascii() and digits.isdigit():
        tokens = min(ceiling, max(floor, int(digits)))
    if not batch_id:  # the headerless kind is never held: nothing would end it
        sealed = end = alive = False
    deadline = _number(raw_deadline) if raw_deadline is not None and batch_id else None
    count = None
    said = _text(raw_end) if end and raw_end is not None else ""
    if 0 < len(said) <= MAX_NUMBER_CHARS and said.isascii() and said.isdigit():
        count = int(said)
    tier = _tier(raw_tier)
    return Scheduled(batch_id, weight, key, tokens, sealed, end, deadline, count, alive, tier)


def batch_of(headers: Headers | None) -> str:
    """The batch a record is scheduled under, as :func:`scheduled_as` reads it (cheaper:
    the read-ahead asks this of every record it reads back)."""
    batch_id, key = "", ""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == BATCH_HEADER:
            batch_id = _text(value)
        elif name == KEY_HEADER:
            key = _text(value)
    return "" if len(batch_id) > MAX_ID_CHARS or len(key) > MAX_ID_CHARS else batch_id


def tier_in(headers: Headers | None) -> str:
    """The service tier a record's headers ask for, as :func:`scheduled_as` reads it
    (readers such as ``status`` and ``list`` ask this of a request)."""
    raw: str | bytes | None = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == TIER_HEADER:
            raw = value
    return _tier(raw)


def _tier(raw: str | bytes | None) -> str:
    # an unknown tier (a typo, a newer publisher) is the default one: never a better
    # place, and never a reason to stop a batch that asked for something
    return DEFAULT if raw is None or len(raw) > 16 else tier_of(_text(raw))


def tag_of(headers: Headers | None) -> float | None:
    """The virtual tag on a request (the last :data:`TAG_HEADER`); None when there is none
    or it is no finite number ≥ 0 of at most :data:`MAX_NUMBER_CHARS` characters: anyone
    who can write the requests topic writes it, so a bad one only leaves the record in
    arrival order (and a good one moves it a bounded way, :mod:`batcher.batcher`)."""
    raw: str | bytes | None = None
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        if name == TAG_HEADER:
            raw = value
    return None if raw is None else _number(raw)


def _number(raw: str | bytes) -> float | None:
    """A finite number ≥ 0 of at most :data:`MAX_NUMBER_CHARS` characters, else None."""
    if len(raw) > MAX_NUMBER_CHARS:
        return None
    try:
        number = float(raw)
    except ValueError:  # not a number (also: not UTF-8, a lone surrogate)
        return None
    return number if math.isfinite(number) and number >= 0 else None


def with_tag(headers: Headers | None, tag: float) -> list[tuple[str, str | bytes | None]]:
    """``headers`` with :data:`TAG_HEADER` set to ``tag`` (any a publisher wrote dropped)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return [*((n, v) for n, v in pairs if n != TAG_HEADER), (TAG_HEADER, repr(tag).encode())]


def headers_of(m: Record) -> Headers | None:
    """``m``'s headers, or None when the client cannot read them (a name that is not
    UTF-8): such a record is forwarded and scheduled as one without headers."""
    try:
        headers: Headers | None = m.headers()
    except Exception:  # the client's decoding of hostile bytes: never the feeder's end
        return None
    return headers


def _text(value: str | bytes | None) -> str:
    """Header text that can be written back as UTF-8 (a state key, a stop's batch id)."""
    if isinstance(value, str):
        value = value.encode("utf-8", "replace")  # a lone surrogate becomes "?"
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


@functools.lru_cache(maxsize=1024)  # a batch's records carry one weight: parsed once
def _weight(raw: str | bytes) -> float:
    if len(raw) > MAX_NUMBER_CHARS:
        return 1.0
    try:
        return clamp_weight(float(_text(raw)))
    except ValueError:  # not a number, or nan
        return 1.0
