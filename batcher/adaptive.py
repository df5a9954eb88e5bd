"""Adaptive batch size from accelerator utilisation (the source document's rule).

Sampled at most once per ``interval_s``: utilisation above ``high`` grows the size by 20 %
(at least by one, so small sizes can grow at all) up to the hardware maximum; below ``low``
it shrinks by 20 % (rounded down) to no less than 1; in between it holds. An out-of-memory
halves it at once. Integer arithmetic keeps ``ceil(5 * 1.2)`` at 6, not 7.

One refinement of the document's rule: low utilisation with a full batch's worth of
requests waiting (``queued >= size``) does not shrink. There the engine is idle because
whatever feeds it is the bottleneck, and smaller batches would only add per-batch
overhead (measured with the echo engine: mean batch 2 instead of 22, 22 % less
throughput, before this rule).

A second one: a shrink is for a trickle (a smaller batch fills, or times out, sooner). When
more requests wait than the shrunk size, nothing waits to fill a batch any more, so
:meth:`backlog` restores the size the shrinks started from at once (up to what waits),
instead of regrowing 20 % an interval while the burst runs in small batches. Measured
(issue 39, echo at 1 s a step): the one request that warms a worker up shrank 32 to 25, and
the first batch of the burst after it ran 25 of 63 waiting; that one short batch shifted
every later batch (one more engine batch in all, 0.91× the throughput of a full first
batch). An out-of-memory is not undone this way: the device could not take that size.
"""

from __future__ import annotations


class AdaptiveBatchSize:
    """Invariant: ``1 <= size <= hardware_max``."""

    def __init__(
        self,
        initial: int,
        hardware_max: int,
        interval_s: float = 1.0,
        high: float = 0.8,
        low: float = 0.5,
    ) -> None:
        if hardware_max < 1:
            raise ValueError(f"hardware_max must be >= 1, got {hardware_max}")
        if not 1 <= initial <= hardware_max:
            raise ValueError(f"initial size {initial} is outside [1, {hardware_max}]")
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.size = initial
        self.hardware_max = hardware_max
        self.interval_s = interval_s
        self.high = high
        self.low = low
        self._last_sample: float | None = None
        #: the size before the current run of low-utilisation shrinks (None: not shrunk)
        self._unshrunk: int | None = None

    def observe(self, utilization: float, now: float, queued: int = 0) -> int:
        """Feed one utilisation reading (0..1) and the requests waiting; returns the size."""
        if self._last_sample is not None and now - self._last_sample < self.interval_s:
            return self.size
        self._last_sample = now
        if utilization > self.high:
            grown = max(-(-self.size * 6 // 5), self.size + 1)
            self.size = min(grown, self.hardware_max)
            if self._unshrunk is not None and self.size >= self._unshrunk:
                self._unshrunk = None
        elif utilization < self.low and queued < self.size:
            if self._unshrunk is None:
                self._unshrunk = self.size
            self.size = max(self.size * 4 // 5, 1)
        return self.size

    def backlog(self, queued: int) -> int:
        """``queued`` requests wait (checked before every batch forms); returns the size.

        More of them than the size after low-utilisation shrinks: the size those shrinks
        started from comes back at once, as far as ``queued`` fills it (module doc).
        """
        unshrunk = self._unshrunk
        if unshrunk is not None and queued > self.size:
            self.size = min(unshrunk, queued)
            if self.size == unshrunk:
                self._unshrunk = None
        return self.size

    def on_out_of_memory(self, limit: int | None = None) -> int:
        """The engine ran out of memory on a batch formed under the size ``limit`` (the
        current size when None): halve the smaller of the two (the size may have grown
        since that batch formed), and forget any shrink :meth:`backlog` would undo."""
        failed = self.size if limit is None else min(self.size, limit)
        self.size = max(failed // 2, 1)
        self._unshrunk = None
        return self.size
