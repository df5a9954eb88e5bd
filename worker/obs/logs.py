"""Logging of a batchpipe process: text for people, JSON lines for log collectors.

Structured fields travel as ``extra=``: ``log.info("batch done", extra={"size": 8})``.
The JSON format emits them as keys of the line's object; the text format appends them as
``key=value``. :class:`SummaryLogger` turns metric snapshots into one periodic line with
rates, so an operator without Prometheus still sees what the worker does.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Literal, TextIO

from worker.obs.metrics import MetricsSnapshot

_FORMATTED = frozenset({"message", "asctime", "taskName"})
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@functools.lru_cache(maxsize=4)
def _reserved(factory: Callable[..., logging.LogRecord]) -> frozenset[str]:
    """Attributes every record made by ``factory`` has; anything else on a record came in
    through ``extra=``. A library may install a factory that adds its own (vLLM adds
    ``vllm_process_name`` to every record once it is imported)."""
    return frozenset(vars(factory("", 0, "", 0, "", None, None))) | _FORMATTED


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    reserved = _reserved(logging.getLogRecordFactory())
    return {k: v for k, v in vars(record).items() if k not in reserved and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, tz=timezone.utc)
        line: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The classic one-line format with ``extra=`` fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        return f"{text} {extras}" if extras else text


class _BatchpipeHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler setup_logging installed, so a second call replaces only it."""


def setup_logging(level: str, fmt: Literal["text", "json"], stream: TextIO | None = None) -> None:
    """Configure the root logger; calling it again replaces the previous setup."""
    handler = _BatchpipeHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BatchpipeHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


@dataclass(frozen=True)
class Summary:
    """Rates over one summary interval."""

    interval_s: float
    requests_per_s: float
    tokens_per_s: float  # prompt + completion
    completion_tokens_per_s: float
    mean_batch_size: float
    lag: int
    lag_unknown_partitions: int
    #: on the engine at the end of the interval; what an in-flight engine, which forms no
    #: batches, reports instead of a mean batch
    sequences: int = 0


class SummaryLogger:
    """Logs a :class:`Summary` at most every ``interval_s`` seconds (time is passed in).

    The first snapshot only sets the baseline: a rate needs two points. A snapshot walks
    the whole metrics registry, so it is taken only when a summary is due, not on every
    step of the loop that asks (issue 25: it was 17 % of the loop's time).
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: tuple[float, MetricsSnapshot] | None = None

    def maybe_log(self, now: float, snapshot: Callable[[], MetricsSnapshot]) -> Summary | None:
        """Log and return a summary if the interval has passed since the last one;
        ``snapshot`` is called only then (and once for the baseline)."""
        if self._last is None:
            self._last = (now, snapshot())
            return None
        then, prev = self._last
        dt = now - then
        if dt < self._interval_s:
            return None
        snap = snapshot()
        self._last = (now, snap)
        batches = snap.batches - prev.batches
        completion = snap.tokens_completion - prev.tokens_completion
        summary = Summary(
            interval_s=dt,
            requests_per_s=(snap.requests - prev.requests) / dt,
            tokens_per_s=(snap.tokens_prompt - prev.tokens_prompt + completion) / dt,
            completion_tokens_per_s=completion / dt,
            mean_batch_size=(snap.batched_requests - prev.batched_requests) / batches
            if batches
            else 0.0,
            lag=snap.total_lag,
            lag_unknown_partitions=snap.lag_unknown_partitions,
            sequences=snap.engine_sequences,
        )
        unknown = summary.lag_unknown_partitions
        # an in-flight engine forms no batches: "mean batch 0.0" read as an idle engine
        running = (
            f"mean batch {summary.mean_batch_size:.1f}"
            if batches
            else f"{summary.sequences} sequences in flight"
        )
        self._logger.info(
            "summary: %.1f req/s, %.1f tokens/s, %s, lag %d%s",
            summary.requests_per_s,
            summary.tokens_per_s,
            running,
            summary.lag,
            f" + unknown on {unknown} partitions" if unknown else "",
            extra=asdict(summary),
        )
        return summary
