"""Progress of a batch being collected: a bar on a terminal, plain lines elsewhere.

:func:`make_progress` picks the form from the stream: a self-redrawing bar with rate
and ETA when the stream is a terminal, one plain line every ``interval_s`` seconds
when it is a pipe or a file (logs stay readable), nothing when quiet. The clock is
injected so the arithmetic is testable without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

Clock = Callable[[], float]

BAR_WIDTH = 30
BAR_REDRAW_S = 0.1
LINE_INTERVAL_S = 10.0


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short enough for a status line."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class Progress:
    """Receives ``update(done, total)`` calls; this base class reports nothing.

    ``total`` is 0 while it is unknown (before the first result names its batch size).
    """

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self.done = 0
        self.total = 0

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def close(self) -> None:
        """Final report; call once when collecting ends, complete or not."""

    def summary(self) -> str:
        """``45/100 (45%) 12.3/s ETA 4s``; the rate is the mean since the start."""
        elapsed = self._clock() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total <= 0:
            return f"{self.done} answered, {rate:.1f}/s"
        text = f"{self.done}/{self.total} ({100 * self.done // self.total}%) {rate:.1f}/s"
        if self.done >= self.total:
            return f"{text} in {format_duration(elapsed)}"
        if rate > 0:
            text += f" ETA {format_duration((self.total - self.done) / rate)}"
        return text


class BarProgress(Progress):
    """A bar redrawn in place with ``\\r``, at most every ``BAR_REDRAW_S`` seconds."""

    def __init__(self, stream: TextIO, label: str, clock: Clock = time.monotonic) -> None:
        super().__init__(clock)
        self._stream = stream
        self._label = label
        self._drawn_at: float | None = None
        self._width = 0

    def update(self, done: int, total: int) -> None:
        super().update(done, total)
        now = self._clock()
        finished = total > 0 and done >= total
        if finished or self._drawn_at is None or now - self._drawn_at >= BAR_REDRAW_S:
            self._draw(now)

    def _draw(self, now: float) -> None:
        filled = BAR_WIDTH * min(self.done, self.total) // self.total if self.total > 0 else 0
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        text = f"{self._label} [{bar}] {self.summary()}"
        # pad over the remains of a longer previous line
        self._stream.write("\r" + text.ljust(self._width))
        self._stream.flush()
        self._width = len(text)
        self._drawn_at = now

    def close(self) -> None:
        self._draw(self._clock())
        self._stream.write("\n")
        self._stream.flush()


class LineProgress(Progress):
    """One plain line per ``interval_s`` seconds, and one at the end."""

    def __init__(
        self,
        stream: TextIO,
        label: str,
        clock: Clock = time.monotonic,
        interval_s: float = LINE_INTERVAL_S,
    ) -> None:
        super().__init__(clock)
        self._stream = stream
        self._label = label
        self._interval_s = interval_s
        self._next_at = self._start + interval_s

    def update(self, done: int, total: int) -> None:
        super().update(done, total)
        now = self._clock()
        if now >= self._next_at:
            self._write()
            self._next_at = now + self._interval_s

    def _write(self) -> None:
        self._stream.write(f"{self._label}: {self.summary()}\n")
        self._stream.flush()

    def close(self) -> None:
        self._write()


def make_progress(
    stream: TextIO, label: str, *, quiet: bool = False, clock: Clock = time.monotonic
) -> Progress:
    """A bar when ``stream`` is a terminal, plain periodic lines when not, nothing if quiet."""
    if quiet:
        return Progress(clock)
    if stream.isatty():
        return BarProgress(stream, label, clock)
    return LineProgress(stream, label, clock)
