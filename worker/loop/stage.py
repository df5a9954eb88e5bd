"""batch → run: what the worker loop asks of the stage that feeds the engine.

Two stages implement it, one per feeding mode (docs/architecture.md §3):
:class:`~worker.loop.engine_stage.EngineStage` hands a :class:`~worker.engines.base.StaticEngine`
one batch at a time; :class:`~worker.loop.inflight_stage.InFlightStage` keeps an
:class:`~worker.engines.base.InFlightEngine` full, submitting requests as room frees.
:func:`worker.loop.service.create_stage` picks the one the engine needs.

Every step the loop calls :meth:`Stage.collect` (answer what finished), then
:meth:`Stage.dispatch` (hand over what is due). On a revoke (or an abort's rewind) it calls
:meth:`Stage.drop` before the batcher and the ledger forget the partitions. A stage that
saw its engine hang or break is *wedged*: it fails what the engine held with 5000, nothing
more is dispatched, and the worker fails its health checks, commits, leaves the group and
exits (code 4) — a hung engine cannot be stopped from Python, only replaced by restarting
the process.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from batcher import DynamicBatcher, Partition, Pending
from worker.config import Config
from worker.engines.base import Completion
from worker.errors import ErrorCode
from worker.loop.jobs import Identity, Job, completed
from worker.loop.outbox import Outbox
from worker.obs.health import Health
from worker.obs.metrics import WorkerMetrics

log = logging.getLogger("batchpipe.worker")


@dataclass(frozen=True)
class StageParts:
    """What a stage works with besides its engine: the worker's own parts."""

    batcher: DynamicBatcher[Job]
    outbox: Outbox
    metrics: WorkerMetrics
    health: Health
    identity: Identity
    config: Config


class Stage(ABC):
    """The engine's side of the loop; one thread (the loop's) calls every method."""

    def __init__(self, parts: StageParts) -> None:
        self._batcher = parts.batcher
        self._outbox = parts.outbox
        self._metrics = parts.metrics
        self._health = parts.health
        self._identity = parts.identity
        self._timeout_s = parts.config.engine.engine_timeout_s
        self._max_batch_tokens = parts.config.batching.max_batch_tokens
        #: the engine hung or broke: nothing more is dispatched
        self.wedged = False
        #: how long the last batch a static engine finished ran (0: none yet, or an
        #: in-flight engine, whose requests end one by one)
        self.last_run_s = 0.0
        #: queued requests wait for the engine to take their tier (``Capacity.flex``): the
        #: loop then polls at the busy pace instead of spinning on their timeout
        self.holding_back = False
        #: the engine takes no flex-tier request now (``Capacity.flex``): the worker lends
        #: the slots of those it holds (:class:`batcher.Admission`) and tells the feeder
        self.flex_closed = False

    @property
    @abstractmethod
    def busy(self) -> bool:
        """Requests are on the engine and not every answer of theirs is collected yet."""

    @abstractmethod
    def dispatch(self, now: float, flush: bool) -> None:
        """Hand the engine what is due and fits (``flush``: without waiting for more)."""

    @abstractmethod
    def collect(self) -> None:
        """Answer what finished; wedge when the engine made no progress for
        ``engine_timeout_s`` or broke."""

    @abstractmethod
    def drop(self, partitions: Collection[Partition]) -> None:
        """``partitions`` left this worker: what of theirs is on the engine is never
        answered here (an in-flight engine aborts it; a static batch runs to its end)."""

    def cancel(self, doomed: Callable[[Pending[Job]], bool]) -> list[Pending[Job]]:
        """Take the requests of stopped batches (``doomed``) out of the queue, unanswered;
        the caller answers them (4005/4006). A static batch already on the engine cannot
        be stopped in part: its requests finish and keep their results."""
        return self._batcher.drop_where(doomed)

    @abstractmethod
    def stop(self) -> None:
        """The worker shuts down: stop feeding the engine."""

    def _answer(
        self,
        completion: Completion,
        *,
        batch_size: int,
        dispatched_at: float,
        finished_at: float,
    ) -> None:
        """Publish the answer of a finished request and of its dedup followers."""
        for item in self._batcher.complete(completion.key):
            job = item.payload
            result = completed(
                job,
                completion,
                identity=self._identity,
                batch_size=batch_size,
                dispatched_at=dispatched_at,
                finished_at=finished_at,
            )
            self._outbox.result(
                result, job.source, result.timings.queued_s, job.request.submitted_at
            )

    def _wedge(self, reason: str, leaders: Iterable[Pending[Job]]) -> None:
        """The engine hung or broke: fail ``leaders`` (what it held); the worker goes not
        ready and not live (:meth:`Health.wedge`), and its loop leaves the group."""
        self.wedged = True
        self._health.set_model_loaded(False, reason)
        self._health.wedge(reason)
        failed = 0
        for leader in leaders:
            for answered in self._batcher.complete(leader.key):
                self._outbox.failure(answered.payload, ErrorCode.ENGINE_FAILED, reason)
                failed += 1
        log.error("%s; failed %d requests, leaving the group", reason, failed)
