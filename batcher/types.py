"""The batcher's data: a queued request, the limits a batch obeys, a formed batch.

Everything here is frozen: these values cross from the batcher to the worker loop and the
engine, and nobody downstream may change what the batcher decided.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Partition = tuple[str, int]
"""(topic, partition)."""

Reason = Literal["full", "timeout", "flush"]


@dataclass(frozen=True)
class Pending(Generic[T]):
    """One admitted request waiting for, or running in, a batch.

        ``key`` is unique among the items in flight. ``tokens`` (prompt plus the generation
        budget) is what counts against ``max_batch_tokens``. ``dedup_key`` is set by the caller
        only when sampling is deterministic: an identical key promises identical model input and
        parameters, so one run can answer all of them (any hashable value that compares equal
    exactly then). ``prefix_key`` identifies the first
        block(s) of prompt tokens (see :func:`batcher.formation.prefix_key_of`).
    """

    key: str
    partition: Partition
    offset: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    payload: T
    priority: int = 0
    deadline: float | None = None
    dedup_key: Hashable | None = None
    prefix_key: bytes | None = None
    #: the feeder's virtual tag (newcomers first, docs/architecture.md §10): queued
    #: requests start lowest tag first, within a bound (:mod:`batcher.batcher`); None
    #: keeps arrival order
    tag: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.max_tokens < 0:
            raise ValueError(
                f"{self.key}: token counts must be >= 0, got prompt_tokens="
                f"{self.prompt_tokens}, max_tokens={self.max_tokens}"
            )

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens

    def expired(self, now: float) -> bool:
        """Past its deadline: answered 4004 instead of being run."""
        return self.deadline is not None and self.deadline < now


@dataclass(frozen=True)
class BatchLimits:
    """The limits every batch obeys, and how batches are chosen within them.

    ``length_aware`` fills a batch with requests of prompt length and ``max_tokens`` similar
    to its oldest request (less padding, fewer wasted decode steps); ``shared_prefix``
    prefers requests whose prompt starts like the oldest one's (prefix-cache reuse).
    With both off, formation is strict FIFO within a priority.

    ``priority_aging_s`` is the wait that raises a request's priority by one level, so a
    request is never starved by a stream of higher-priority ones (the bound is stated in
    :mod:`batcher.batcher`). It must be finite: without aging, nothing bounds the wait.
    """

    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    timeout_s: float = 0.1
    length_aware: bool = True
    shared_prefix: bool = True
    priority_aging_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {self.timeout_s}")
        if not (math.isfinite(self.priority_aging_s) and self.priority_aging_s > 0):
            raise ValueError(
                f"priority_aging_s must be > 0 and finite, got {self.priority_aging_s}"
            )


@dataclass(frozen=True)
class Batch(Generic[T]):
    """Requests released together. ``items`` are the ones to run; dedup followers ride on
    their leaders and are returned by :meth:`DynamicBatcher.complete`, not listed here.
    ``items[0]`` is the anchor: the queued request of the highest effective priority
    (priority raised by its wait; a tag moves a request ahead within a bound: see
    :mod:`batcher.batcher`)."""

    items: tuple[Pending[T], ...]
    reason: Reason
    formed_at: float

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def tokens(self) -> int:
        """Prompt plus generation budget of every item: what max_batch_tokens bounds."""
        return sum(item.tokens for item in self.items)

    @property
    def prompt_tokens(self) -> int:
        return sum(item.prompt_tokens for item in self.items)

    @property
    def longest_prompt(self) -> int:
        return max((item.prompt_tokens for item in self.items), default=0)

    @property
    def padding(self) -> int:
        """Pad positions needed to pad every prompt to the longest one (static batching)."""
        return self.size * self.longest_prompt - self.prompt_tokens

    @property
    def padding_waste(self) -> float:
        """Pad positions per real prompt token: 0.0 when every prompt has the same length."""
        real = self.prompt_tokens
        return self.padding / real if real else 0.0

    @property
    def oldest_arrival(self) -> float:
        return min(item.arrival for item in self.items)

    def size_fill(self, max_batch_size: int) -> float:
        """Fraction of the batch-size limit used."""
        return self.size / max_batch_size

    def token_fill(self, max_batch_tokens: int) -> float:
        """Fraction of the token limit used."""
        return self.tokens / max_batch_tokens
