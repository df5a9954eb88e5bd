"""Admission control: at most ``prefetch_count`` requests in the worker at once.

The worker acquires a slot per request it takes from Kafka and releases it when the request
is answered; while there is no room it stops fetching (pauses its partitions), so a slow
engine pushes back on the broker instead of filling memory.

*Lent slots.* Flex-tier requests the engine will not start now (its server under
pressure, ``Capacity.flex``) wait in the worker and would hold their slots until the
pressure ends: the other tiers' requests, which that engine still starts, could not be
admitted behind them. So the worker lends their slots (:attr:`Admission.lent`, at most
``limit``): while flex is held back the worker holds up to twice ``prefetch_count``, and
once flex starts again it admits nothing until what it holds is back within the limit.
"""

from __future__ import annotations


class Admission:
    """A counting gate. Invariant: ``0 <= inflight <= limit + lent <= 2 × limit`` when
    admitted, and ``peak >= inflight``."""

    def __init__(self, prefetch_count: int) -> None:
        if prefetch_count < 1:
            raise ValueError(f"prefetch_count must be >= 1, got {prefetch_count}")
        self.limit = prefetch_count
        self.inflight = 0
        self.peak = 0
        self._lent = 0

    @property
    def lent(self) -> int:
        """Slots lent beyond the limit: the flex requests held back (module doc)."""
        return self._lent

    @lent.setter
    def lent(self, slots: int) -> None:
        self._lent = min(self.limit, max(0, slots))

    @property
    def room(self) -> int:
        """How many more requests may be admitted now (negative after lent slots were
        taken back: nothing is admitted until the requests held are within the limit)."""
        return self.limit + self._lent - self.inflight

    def has_room(self) -> bool:
        return self.inflight < self.limit + self._lent

    def acquire(self, n: int = 1) -> None:
        """Take ``n`` slots. The caller takes no more than :attr:`room` (the worker polls at
        most that many records); more is a bug in the caller and raises ``ValueError``."""
        if n < 0:
            raise ValueError(f"cannot acquire {n} slots")
        if self.inflight + n > self.limit + self._lent:
            raise ValueError(
                f"acquiring {n} with {self.inflight} of {self.limit} (+{self._lent} lent) in flight"
            )
        self.inflight += n
        self.peak = max(self.peak, self.inflight)

    def release(self, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"cannot release {n} slots")
        if n > self.inflight:
            raise ValueError(f"releasing {n} with only {self.inflight} in flight")
        self.inflight -= n
