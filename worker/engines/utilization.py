"""What an engine reports as its utilization: the GPU's own counter, or its busy time.

On CUDA with NVML's Python binding (pynvml) installed, the GPU's utilization counter is
read. Otherwise (echo, hf on the CPU, no pynvml) it is the fraction of wall time the
engine spent running batches. The adaptive batch size reads it, so a batch still running
when it is read counts too, not only finished ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class BusyMeter:
    """Busy fraction of wall time since the previous :meth:`fraction` call; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = clock()
        self._busy_s = 0.0
        self._busy_since: float | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Count the time spent inside the ``with`` block as busy."""
        with self._lock:
            self._busy_since = self._clock()
        try:
            yield
        finally:
            with self._lock:
                if self._busy_since is not None:
                    self._busy_s += self._clock() - self._busy_since
                self._busy_since = None

    def fraction(self) -> float:
        """Busy share of the time since the previous call, in [0, 1]; starts a new window."""
        with self._lock:
            now = self._clock()
            busy = self._busy_s
            running = self._busy_since is not None
            if self._busy_since is not None:
                busy += now - self._busy_since
                self._busy_since = now  # the running batch counts again in the next window
            elapsed = now - self._window_start
            self._window_start = now
            self._busy_s = 0.0
        if elapsed <= 0:
            return 1.0 if running else 0.0
        return min(1.0, max(0.0, busy / elapsed))


def gpu_counter(device: Any = None) -> Callable[[], float] | None:
    """A reader of the GPU's utilization in [0, 1] (NVML via torch), or None if unreadable."""
    import torch

    try:
        torch.cuda.utilization(device)
    except Exception:  # ModuleNotFoundError for pynvml, no NVML driver, no CUDA device
        return None
    return lambda: float(torch.cuda.utilization(device)) / 100.0
