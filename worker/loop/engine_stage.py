"""batch → run for a static engine: formed batches go to the engine thread; what finishes
becomes results (the :class:`~worker.loop.stage.Stage` of :class:`StaticEngine`).

At most one batch is in the engine at a time. The next one is formed only when the
engine is free, so under load it takes everything that queued meanwhile (fuller
batches), while polling and decoding go on in the worker loop. A batch that outlives
``engine.engine_timeout_s`` fails with 5000 and wedges the worker (not live, not ready):
a hung engine thread cannot be stopped from Python, only replaced by restarting the
process, so the worker leaves the group and exits (:meth:`worker.loop.service.Worker.run`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from batcher import AdaptiveBatchSize, Batch, Partition
from worker.engines.base import StaticEngine
from worker.loop.jobs import Job
from worker.loop.runner import BatchDone, EngineRunner, Finished
from worker.loop.stage import Stage, StageParts

log = logging.getLogger("batchpipe.worker")


@dataclass(frozen=True)
class _Running:
    """The batch in the engine: what it holds, when it went in, and the batch size limit
    in force when it formed (the adaptive size may change while it runs)."""

    run_id: int
    batch: Batch[Job]
    dispatched_at: float
    size_limit: int


class EngineStage(Stage):
    def __init__(
        self, engine: StaticEngine, adaptive: AdaptiveBatchSize, parts: StageParts
    ) -> None:
        super().__init__(parts)
        self._runner = EngineRunner(engine)
        self._adaptive = adaptive
        self._running: _Running | None = None

    @property
    def busy(self) -> bool:
        """A batch is out and not every one of its events has been collected yet.

        Not the runner's own flag: the engine thread is free a moment before its last
        events are collected, and a batch dispatched in that moment would make them
        look like events of the new batch.
        """
        return self._running is not None

    def stop(self) -> None:
        # a hung engine thread never ends: waiting for it would only delay the exit
        self._runner.stop(timeout_s=0.0 if self.wedged else 5.0)

    def drop(self, partitions: Collection[Partition]) -> None:
        """Nothing to do: a batch on the engine cannot be stopped part-way, so it runs to its
        end, and the answers of dropped requests find no one left in the batcher."""

    def dispatch(self, now: float, flush: bool) -> None:
        """Hand the next due batch to the engine, if the engine is free."""
        if self.wedged or self.busy:
            return
        with self._metrics.stage("batch"):
            batch = self._batcher.next_batch(now, flush=flush)
        if batch is None:
            return
        run_id = self._runner.submit([item.payload.engine_input for item in batch.items])
        self._running = _Running(run_id, batch, now, self._batcher.max_batch_size)
        self._metrics.set_engine_load(batch.size, batch.tokens)
        log.debug(
            "batch %d: %d requests, %d tokens, %s",
            run_id,
            batch.size,
            batch.tokens,
            batch.reason,
            extra={"batch_size": batch.size, "batch_tokens": batch.tokens},
        )

    def collect(self) -> None:
        """Answer what finished; fail a batch that outlived ``engine_timeout_s``."""
        running = self._running
        if running is None:
            return
        timeout_s = self._timeout_s
        engine_s: list[float] = []
        for event in self._runner.drain():
            if isinstance(event, Finished) and event.run_id == running.run_id:
                engine_s.append(event.finished_at - running.dispatched_at)
                self._answer(
                    event.completion,
                    batch_size=running.batch.size,
                    dispatched_at=running.dispatched_at,
                    finished_at=event.finished_at,
                )
            elif isinstance(event, BatchDone) and event.run_id == running.run_id:
                self._batch_done(running, event)
        self._metrics.engine_requests(engine_s)  # one update per bucket for them all
        since = self._runner.running_since()
        if self._running is not None and since is not None and time.monotonic() - since > timeout_s:
            self._engine_hung(self._running, timeout_s)

    def _batch_done(self, running: _Running, event: BatchDone) -> None:
        batch = running.batch
        self._metrics.batch_done(
            size=batch.size,
            tokens=batch.tokens,
            fill_ratio=batch.size_fill(running.size_limit),
            token_fill_ratio=batch.token_fill(self._max_batch_tokens),
            padding_waste=batch.padding_waste,
            batch_wait_s=[running.dispatched_at - i.payload.admitted_at for i in batch.items],
            engine_s=event.engine_s,
        )
        for _ in range(event.out_of_memory):
            self._batcher.max_batch_size = self._adaptive.on_out_of_memory(running.size_limit)
        self.last_run_s = event.engine_s
        self._running = None
        self._metrics.set_engine_load(0, 0)

    def _engine_hung(self, running: _Running, timeout_s: float) -> None:
        """The engine call outlived ``engine_timeout_s``: fail its requests, stop serving."""
        self._running = None
        self._metrics.set_engine_load(0, 0)
        self._wedge(f"engine call exceeded engine_timeout_s={timeout_s:g}", running.batch.items)
