"""Prometheus metrics of one worker (docs/architecture.md §2 "metrics"; docs/metrics.md).

:class:`WorkerMetrics` owns its own :class:`CollectorRegistry`, never the global one, so
several workers (or tests) in one process do not collide. Every label takes values from a
small fixed set (model, status, error code, token kind, stage, transaction outcome,
rebalance kind, and topic/partition for lag): a per-request label would make the series
count grow without bound. The fixed sets callers pass are ``Literal`` types, so mypy
rejects any other value. Label children of the fixed sets are created up front, so every
series exists (at zero) from the first scrape and ``rate()`` sees the first increment.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from worker.errors import ErrorCode
from worker.kafka.outcome import TxOutcome
from worker.wire.messages import Status

Stage = Literal["decode", "batch", "encode", "produce"]
RebalanceKind = Literal["assign", "revoke", "lost"]

STATUSES: Final[tuple[Status, ...]] = get_args(Status)
TOKEN_KINDS: Final = ("prompt", "completion", "reasoning")
STAGES: Final[tuple[Stage, ...]] = get_args(Stage)
TX_OUTCOMES: Final[tuple[TxOutcome, ...]] = get_args(TxOutcome)
REBALANCE_KINDS: Final[tuple[RebalanceKind, ...]] = get_args(RebalanceKind)

# 5 ms .. 10 min, roughly log-spaced: a request of an LLM batch takes from a few
# milliseconds (echo engine) to minutes (long generations queued behind a full batch).
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKEN_BUCKETS: Final = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
FILL_RATIO_BUCKETS: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
PADDING_WASTE_BUCKETS: Final = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)


def observe_all(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, one update per bucket touched:
    ``observe`` scans the buckets and takes a lock per value (issue 25: a batch's waits)."""
    if len(values) < 2:
        for value in values:
            histogram.observe(value)
        return
    # prometheus_client's own fields, as ``observe`` updates them: the sum, and each bucket
    # counts the values at most its bound (the last bound is +Inf)
    bounds: list[float] = histogram._upper_bounds
    counts = Tally(bisect_left(bounds, value) for value in values)
    for index, count in counts.items():
        histogram._buckets[index].inc(count)
    histogram._sum.inc(sum(values))


class StageTimer:
    """Times one ``with`` body into a stage's seconds, added to its counter at the next
    :meth:`WorkerMetrics.flush`: a plain object, not a generator context manager, as it
    runs a few times per request (issue 25)."""

    __slots__ = ("_name", "_pending", "_start")

    def __init__(self, pending: _Pending, name: Stage) -> None:
        self._pending = pending
        self._name = name
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        self._pending.add_stage(self._name, time.perf_counter() - self._start)


class _Pending:
    """What answers and stage timers added since the last flush (issue 42: one counter
    update per series per step, where each answer took seven locked updates)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.statuses: Tally[Status] = Tally()
        self.codes: Tally[int] = Tally()
        self.tokens = [0] * len(TOKEN_KINDS)
        self.e2e: list[float] = []
        self.queue_waits: list[float] = []
        self.stages: dict[Stage, float] = {}

    def add_stage(self, name: Stage, seconds: float) -> None:
        with self.lock:
            self.stages[name] = self.stages.get(name, 0.0) + seconds


@dataclass(frozen=True)
class MetricsSnapshot:
    """Headline totals since the worker started, for the summary log and ``make demo``."""

    requests_completed: int
    requests_failed: int
    dead_letters: int
    tokens_prompt: int
    tokens_completion: int
    tokens_reasoning: int  # a part of tokens_completion, as in the OpenAI usage object
    batches: int
    batched_requests: int
    fill_ratio_sum: float
    token_fill_ratio_sum: float
    total_lag: int  # of the partitions whose lag is known
    lag_unknown_partitions: int
    #: requests on the engine now: a static batch's, or an in-flight engine's sequences
    engine_sequences: int = 0

    @property
    def requests(self) -> int:
        return self.requests_completed + self.requests_failed

    @property
    def mean_batch_size(self) -> float:
        return self.batched_requests / self.batches if self.batches else 0.0

    @property
    def mean_fill_ratio(self) -> float:
        """Mean batch size ÷ the batch size limit in force when the batch formed."""
        return self.fill_ratio_sum / self.batches if self.batches else 0.0

    @property
    def mean_token_fill_ratio(self) -> float:
        """Mean batch tokens ÷ ``max_batch_tokens``."""
        return self.token_fill_ratio_sum / self.batches if self.batches else 0.0


class WorkerMetrics:
    """The metrics of one worker process; one small method per event the worker sees.

    All methods are thread-safe. An error ``code`` outside :class:`ErrorCode` raises
    :class:`ValueError`: that is a bug in the caller, and accepting it would create an
    unbounded label.
    """

    def __init__(
        self,
        model: str,
        engine: str,
        version: str,
        prefetch_limit: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._model = model
        self._lag: dict[tuple[str, str], int] = {}
        self._lag_unknown_count = 0
        self._lag_lock = threading.Lock()

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=self.registry)

        self._requests = counter("batchpipe_requests", "Requests answered.", ["model", "status"])
        self._errors = counter("batchpipe_request_errors", "Errors by code.", ["code"])
        self._dead_letters = counter("batchpipe_dead_letters", "Dead-letter records.")
        self._latency = histogram(
            "batchpipe_request_latency_seconds",
            "submitted_at to result published.",
            LATENCY_BUCKETS,
        )
        self._queue_wait = histogram(
            "batchpipe_queue_wait_seconds", "Consumed to handed to the engine.", LATENCY_BUCKETS
        )
        self._batch_wait = histogram(
            "batchpipe_batch_wait_seconds", "Time a request waited in the batcher.", LATENCY_BUCKETS
        )
        self._engine_batch = histogram(
            "batchpipe_engine_batch_seconds", "Engine time per batch.", LATENCY_BUCKETS
        )
        self._engine_request = histogram(
            "batchpipe_engine_request_seconds",
            "Handed to the engine to finished, per request.",
            LATENCY_BUCKETS,
        )
        self._engine_sequences = gauge(
            "batchpipe_engine_sequences", "Requests on the engine now (a batch, or in flight)."
        )
        self._engine_tokens = gauge(
            "batchpipe_engine_tokens", "Prompt + max_tokens of the requests on the engine now."
        )
        self._batch_size = histogram(
            "batchpipe_batch_size", "Requests per batch.", BATCH_SIZE_BUCKETS
        )
        self._batch_tokens = histogram(
            "batchpipe_batch_tokens", "Token budget used per batch.", BATCH_TOKEN_BUCKETS
        )
        self._fill = histogram(
            "batchpipe_batch_fill_ratio",
            "Batch size / the batch size limit when it formed.",
            FILL_RATIO_BUCKETS,
        )
        self._token_fill = histogram(
            "batchpipe_batch_token_fill_ratio",
            "Batch tokens / max_batch_tokens.",
            FILL_RATIO_BUCKETS,
        )
        self._padding = histogram(
            "batchpipe_padding_waste_ratio",
            "Padded positions / real tokens.",
            PADDING_WASTE_BUCKETS,
        )
        self._tokens = counter("batchpipe_tokens", "Tokens answered.", ["model", "kind"])
        self._inflight = gauge("batchpipe_inflight_requests", "Consumed, not yet answered.")
        self._prefetch = gauge("batchpipe_prefetch_limit", "The most requests in flight.")
        self._adaptive = gauge("batchpipe_adaptive_batch_size", "Current maximum batch size.")
        self._utilization = gauge("batchpipe_engine_utilization", "Accelerator utilisation 0..1.")
        self._dedup = counter("batchpipe_dedup_hits", "Requests served by an identical run.")
        self._consumer_lag = gauge(
            "batchpipe_consumer_lag",
            "Records of an assigned partition not answered yet (unread or in flight).",
            ["topic", "partition"],
        )
        self._lag_unknown = gauge(
            "batchpipe_consumer_lag_unknown_partitions",
            "Assigned partitions whose lag could not be measured.",
        )
        self._transactions = counter("batchpipe_transactions", "Transactions.", ["outcome"])
        self._rebalances = counter("batchpipe_rebalances", "Rebalance events.", ["kind"])
        self._answered_before = counter(
            "batchpipe_answered_before",
            "Records read that an earlier owner of their partition had answered: skipped.",
        )
        self._paused = gauge("batchpipe_paused_partitions", "Partitions paused (backpressure).")
        self._stage = counter("batchpipe_stage_seconds", "Time per pipeline stage.", ["stage"])
        self._build = gauge(
            "batchpipe_build_info",
            "Always 1; labels describe the worker.",
            ["version", "engine", "model"],
        )
        self._ready = gauge("batchpipe_worker_ready", "1 when /readyz answers 200.")

        # the children of the fixed label sets, kept: ``labels()`` costs a lock and a
        # lookup, too much once per request (issue 25)
        self._by_status = {status: self._requests.labels(model, status) for status in STATUSES}
        self._by_code = {int(code): self._errors.labels(str(int(code))) for code in ErrorCode}
        self._by_kind = [self._tokens.labels(model, kind) for kind in TOKEN_KINDS]
        for outcome in TX_OUTCOMES:
            self._transactions.labels(outcome)
        for rebalance in REBALANCE_KINDS:
            self._rebalances.labels(rebalance)
        self._by_stage = {stage: self._stage.labels(stage) for stage in STAGES}
        self._pending = _Pending()
        self._build.labels(version, engine, model).set(1)
        self._prefetch.set(prefetch_limit)

    def answered(
        self,
        status: Status,
        code: int | None,
        usage_prompt: int,
        usage_completion: int,
        usage_reasoning: int,
        e2e_s: float | None,
        queue_wait_s: float,
    ) -> None:
        """A result (completed or failed) was published. ``e2e_s`` is None without
        submitted_at. Counted at the next :meth:`flush`."""
        if status not in self._by_status:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        error = None if code is None else int(ErrorCode(code))  # validate first
        pending = self._pending
        with pending.lock:
            pending.statuses[status] += 1
            if error is not None:
                pending.codes[error] += 1
            tokens = pending.tokens
            tokens[0] += usage_prompt
            tokens[1] += usage_completion
            tokens[2] += usage_reasoning
            if e2e_s is not None:
                pending.e2e.append(e2e_s)
            pending.queue_waits.append(queue_wait_s)

    def flush(self) -> None:
        """Add to the series what :meth:`answered` and the stage timers gathered since the
        last flush: the worker's loop calls it once per step; reading (:meth:`render`,
        :meth:`snapshot`) calls it first."""
        pending = self._pending
        with pending.lock:
            statuses, codes, tokens = pending.statuses, pending.codes, pending.tokens
            e2e, waits, stages = pending.e2e, pending.queue_waits, pending.stages
            pending.clear()
        for status, count in statuses.items():
            self._by_status[status].inc(count)
        for error, count in codes.items():
            self._by_code[error].inc(count)
        for child, count in zip(self._by_kind, tokens, strict=True):
            if count:
                child.inc(count)
        observe_all(self._latency, e2e)
        observe_all(self._queue_wait, waits)
        for stage, seconds in stages.items():
            self._by_stage[stage].inc(seconds)

    def dead_lettered(self, code: int = ErrorCode.MALFORMED) -> None:
        """A record went to the dead-letter topic instead of a result (do not call answered())."""
        self._by_code[int(ErrorCode(code))].inc()
        self._dead_letters.inc()

    def batch_done(
        self,
        size: int,
        tokens: int,
        fill_ratio: float,
        token_fill_ratio: float,
        padding_waste: float,
        batch_wait_s: Sequence[float] | float,
        engine_s: float,
    ) -> None:
        """A batch left the engine. ``fill_ratio``: size ÷ the batch size limit in force when
        it formed; ``token_fill_ratio``: tokens ÷ ``max_batch_tokens``. ``batch_wait_s``:
        one wait per request, or one for all."""
        self._batch_size.observe(size)
        self._batch_tokens.observe(tokens)
        self._fill.observe(fill_ratio)
        self._token_fill.observe(token_fill_ratio)
        self._padding.observe(padding_waste)
        waits = (batch_wait_s,) if isinstance(batch_wait_s, (int, float)) else batch_wait_s
        observe_all(self._batch_wait, waits)
        self._engine_batch.observe(engine_s)

    def submitted(self, batch_wait_s: Sequence[float]) -> None:
        """Requests went into an in-flight engine, after these waits in the batcher."""
        observe_all(self._batch_wait, batch_wait_s)

    def engine_requests(self, seconds: Sequence[float]) -> None:
        """Requests finished, each ``seconds`` after it was handed to the engine."""
        observe_all(self._engine_request, seconds)

    def set_engine_load(self, sequences: int, tokens: int) -> None:
        """What the engine holds now: requests, and their prompt + ``max_tokens``."""
        self._engine_sequences.set(sequences)
        self._engine_tokens.set(tokens)

    def set_inflight(self, n: int) -> None:
        self._inflight.set(n)

    def set_adaptive_size(self, n: int) -> None:
        self._adaptive.set(n)

    def set_utilization(self, u: float) -> None:
        if not 0.0 <= u <= 1.0:
            raise ValueError(f"utilization must be within 0..1, got {u}")
        self._utilization.set(u)

    def set_ready(self, ready: bool) -> None:
        """Mirrors /readyz; :class:`worker.obs.health.Health` calls it on every change."""
        self._ready.set(1 if ready else 0)

    def dedup_hit(self) -> None:
        self._dedup.inc()

    def transaction(self, outcome: TxOutcome) -> None:
        self._transactions.labels(outcome).inc()

    def rebalance(self, kind: RebalanceKind) -> None:
        self._rebalances.labels(kind).inc()

    def answered_before(self, n: int) -> None:
        """``n`` records read were answered by an earlier owner (docs/architecture.md §2)."""
        self._answered_before.inc(n)

    def set_paused(self, n: int) -> None:
        self._paused.set(n)

    def set_consumer_lag(self, lags: Mapping[tuple[str, int], int | None]) -> None:
        """The lag of every assigned partition (:mod:`worker.obs.lag`); None: unknown.

        Unknown partitions are counted in ``batchpipe_consumer_lag_unknown_partitions`` and
        have no lag series, nor have partitions no longer assigned: a partition that moved
        to another worker does not keep reporting its last lag from here.
        """
        known = {(t, str(p)): lag for (t, p), lag in lags.items() if lag is not None}
        with self._lag_lock:
            for key in self._lag.keys() - known.keys():
                self._consumer_lag.remove(*key)
            for (topic, partition), lag in known.items():
                self._consumer_lag.labels(topic, partition).set(lag)
            self._lag = known
            self._lag_unknown_count = len(lags) - len(known)
            self._lag_unknown.set(self._lag_unknown_count)

    def stage(self, name: Stage) -> StageTimer:
        """Add the wall time of the ``with`` body to ``batchpipe_stage_seconds_total{stage}``."""
        return StageTimer(self._pending, name)

    def add_stage(self, name: Stage, seconds: float) -> None:
        """Add ``seconds`` timed by the caller (e.g. summed over a poll's records)."""
        self._pending.add_stage(name, seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of this worker's registry."""
        self.flush()
        return generate_latest(self.registry)

    def snapshot(self) -> MetricsSnapshot:
        self.flush()
        with self._lag_lock:
            total_lag = sum(self._lag.values())
            lag_unknown = self._lag_unknown_count
        return MetricsSnapshot(
            requests_completed=int(self._value("batchpipe_requests_total", status="completed")),
            requests_failed=int(self._value("batchpipe_requests_total", status="failed")),
            dead_letters=int(self._value("batchpipe_dead_letters_total")),
            tokens_prompt=int(self._value("batchpipe_tokens_total", kind="prompt")),
            tokens_completion=int(self._value("batchpipe_tokens_total", kind="completion")),
            tokens_reasoning=int(self._value("batchpipe_tokens_total", kind="reasoning")),
            batches=int(self._value("batchpipe_batch_size_count")),
            batched_requests=int(self._value("batchpipe_batch_size_sum")),
            fill_ratio_sum=self._value("batchpipe_batch_fill_ratio_sum"),
            token_fill_ratio_sum=self._value("batchpipe_batch_token_fill_ratio_sum"),
            total_lag=total_lag,
            lag_unknown_partitions=lag_unknown,
            engine_sequences=int(self._value("batchpipe_engine_sequences")),
        )

    def _value(self, name: str, **labels: str) -> float:
        if "status" in labels or "kind" in labels:
            labels = {"model": self._model, **labels}
        value = self.registry.get_sample_value(name, labels)
        return value if value is not None else 0.0
