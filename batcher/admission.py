"""Admission control: at most ``prefetch_count`` requests in the worker at once.

The worker acquires a slot per request it takes from Kafka and releases it when the request
is answered; while there is no room it stops fetching (pauses its partitions), so a slow
engine pushes back on the broker instead of filling memory.
"""

from __future__ import annotations


class Admission:
    """A counting gate. Invariant: ``0 <= inflight <= limit`` and ``peak >= inflight``."""

    def __init__(self, prefetch_count: int) -> None:
        if prefetch_count < 1:
            raise ValueError(f"prefetch_count must be >= 1, got {prefetch_count}")
        self.limit = prefetch_count
        self.inflight = 0
        self.peak = 0

    @property
    def room(self) -> int:
        """How many more requests may be admitted now."""
        return self.limit - self.inflight

    def has_room(self) -> bool:
        return self.inflight < self.limit

    def acquire(self, n: int = 1) -> None:
        """Take ``n`` slots. The caller takes no more than :attr:`room` (the worker polls at
        most that many records); more is a bug in the caller and raises ``ValueError``."""
        if n < 0:
            raise ValueError(f"cannot acquire {n} slots")
        if self.inflight + n > self.limit:
            raise ValueError(f"acquiring {n} with {self.inflight} of {self.limit} in flight")
        self.inflight += n
        self.peak = max(self.peak, self.inflight)

    def release(self, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"cannot release {n} slots")
        if n > self.inflight:
            raise ValueError(f"releasing {n} with only {self.inflight} in flight")
        self.inflight -= n
