"""batch → run for an in-flight engine: keep it full, answer each request as it finishes.

The :class:`~worker.loop.stage.Stage` of :class:`~worker.engines.base.InFlightEngine`
(vllm, trtllm, echo in flight). There is no batch to wait for: whenever the engine has
room, :meth:`DynamicBatcher.take` chooses which queued requests go next — by the batcher's
formation (priority with aging, deadlines, dedup, shared prefix, length) — and they are
submitted at once. The room is the smallest of what the engine reports
(:meth:`~worker.engines.base.InFlightEngine.capacity`) and the worker's budget:
``batching.max_batch_size`` sequences (the adaptive size, when on) and
``batching.max_batch_tokens`` tokens (prompt + ``max_tokens`` of each) in flight.
``batching.timeout_ms`` still bounds how long a request waits while there is room.
While the engine takes no flex-tier request (``Capacity.flex``, the remote engine's
server under pressure), only the other tiers' requests are taken; the flex ones wait in
the queue, where no engine timeout counts them.

Each completion is answered when it arrives; offsets commit past answered records only
(the ledger and the publisher are the same as for static batches). A revoked partition's
requests are aborted in the engine and never answered here; a record read again later is
a new consumption with a new key (:attr:`worker.loop.jobs.Source.ref`), so it never meets its
old run. The stage is *wedged* (:class:`~worker.loop.stage.Stage`: its requests fail with 5000,
the worker exits) when the engine completes nothing for ``engine.engine_timeout_s`` while
holding requests, or when ``capacity``, ``submit``, ``abort`` or ``completions`` raise
(the engine itself broke).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from batcher import Partition, Pending
from worker.engines.base import InFlightEngine
from worker.loop.jobs import Job
from worker.loop.stage import Stage, StageParts

log = logging.getLogger("batchpipe.worker")


@dataclass(frozen=True)
class _Flight:
    """A request on the engine: what it is, when it went in, and how many requests were on
    the engine with it then (its result's ``batch_size``)."""

    item: Pending[Job]
    submitted_at: float
    sequences: int


class InFlightStage(Stage):
    def __init__(self, engine: InFlightEngine, parts: StageParts) -> None:
        super().__init__(parts)
        self._engine = engine
        self._flights: dict[str, _Flight] = {}
        self._tokens = 0  # prompt + max_tokens of every request in flight
        # the last completion, or when the engine went from holding nothing to holding work
        self._progress_at = 0.0

    @property
    def busy(self) -> bool:
        return bool(self._flights)

    def dispatch(self, now: float, flush: bool) -> None:
        """Submit the requests :meth:`DynamicBatcher.take` releases for the room left."""
        if self.wedged:
            return
        try:
            room = self._engine.capacity()
        except Exception as exc:
            self._broken("capacity", exc)
            return
        sequences = min(room.sequences, self._batcher.max_batch_size - len(self._flights))
        tokens = min(room.tokens, self._max_batch_tokens - self._tokens)
        with self._metrics.stage("batch"):
            batch = self._batcher.take(now, sequences, tokens, flush=flush, flex=room.flex)
        self.flex_closed = not room.flex
        self.holding_back = batch is None and self.flex_closed and len(self._batcher) > 0
        if batch is None:
            return
        if not self._flights:
            self._progress_at = time.monotonic()
        for item in batch.items:  # registered first: a failing submit fails them all
            self._flights[item.key] = _Flight(item, now, len(self._flights) + 1)
            self._tokens += item.tokens
        try:
            for item in batch.items:
                self._engine.submit(item.payload.engine_input)
        except Exception as exc:
            self._broken("submit", exc)
            return
        self._metrics.submitted([now - item.payload.admitted_at for item in batch.items])
        self._metrics.set_engine_load(len(self._flights), self._tokens)
        log.debug(
            "submitted %d requests (%s); %d in flight",
            batch.size,
            batch.reason,
            len(self._flights),
            extra={"batch_size": batch.size, "batch_tokens": batch.tokens},
        )

    def collect(self) -> None:
        """Answer every completion the engine reports; wedge on no progress or a failure."""
        if self.wedged or not self._flights:
            return
        try:
            completions = self._engine.completions()
        except Exception as exc:
            self._broken("completions", exc)
            return
        now = time.monotonic()
        engine_s: list[float] = []
        for completion in completions:
            flight = self._flights.pop(completion.key, None)
            if flight is None:
                # aborted: the contract says it never completes; nobody is left to answer it
                log.warning("engine completed %s after it was aborted", completion.key)
                continue
            self._tokens -= flight.item.tokens
            self._progress_at = now
            engine_s.append(now - flight.submitted_at)
            self._answer(
                completion,
                batch_size=flight.sequences,
                dispatched_at=flight.submitted_at,
                finished_at=now,
            )
        self._metrics.engine_requests(engine_s)  # one update per bucket for them all
        self._metrics.set_engine_load(len(self._flights), self._tokens)
        if self._flights and now - self._progress_at > self._timeout_s:
            self._abort_all(
                f"engine completed nothing for engine_timeout_s={self._timeout_s:g} "
                f"while holding {len(self._flights)} requests"
            )

    def drop(self, partitions: Collection[Partition]) -> None:
        """Abort the requests of ``partitions`` in the engine; they are never answered here."""
        revoked = set(partitions)
        keys = [key for key, f in self._flights.items() if f.item.partition in revoked]
        if not keys:
            return
        for key in keys:
            self._tokens -= self._flights.pop(key).item.tokens
        self._metrics.set_engine_load(len(self._flights), self._tokens)
        log.info("aborting %d requests of revoked partitions", len(keys))
        try:
            self._engine.abort(keys)
        except Exception as exc:
            self._broken("abort", exc)

    def cancel(self, doomed: Callable[[Pending[Job]], bool]) -> list[Pending[Job]]:
        """Take the requests of stopped batches out of the queue *and* off the engine
        (aborted: the contract says they never complete); the caller answers them."""
        dropped = self._batcher.drop_where(doomed, running=True)
        keys = [item.key for item in dropped if item.key in self._flights]
        if keys:
            for key in keys:
                self._tokens -= self._flights.pop(key).item.tokens
            self._metrics.set_engine_load(len(self._flights), self._tokens)
            log.info("aborting %d requests of stopped batches", len(keys))
            try:
                self._engine.abort(keys)
            except Exception as exc:
                self._broken("abort", exc)
        return dropped

    def stop(self) -> None:
        """Abort what is still in flight: its records were not committed, so their next
        owner answers them (``Engine.close`` aborts them too; this says so first)."""
        if self._flights and not self.wedged:
            try:
                self._engine.abort(list(self._flights))
            except Exception as exc:
                log.warning("aborting on shutdown failed: %s: %s", type(exc).__name__, exc)
        self._flights.clear()
        self._tokens = 0

    def _broken(self, call: str, exc: Exception) -> None:
        self._abort_all(f"engine failed in {call}: {type(exc).__name__}: {exc}")

    def _abort_all(self, reason: str) -> None:
        """Fail everything in flight with 5000, ask the engine to drop it, wedge."""
        flights = list(self._flights.values())
        self._flights.clear()
        self._tokens = 0
        self._metrics.set_engine_load(0, 0)
        try:
            self._engine.abort([f.item.key for f in flights])
        except Exception as exc:  # already failing: the requests are answered below anyway
            log.warning("abort after the engine failed: %s: %s", type(exc).__name__, exc)
        self._wedge(reason, [f.item for f in flights])
