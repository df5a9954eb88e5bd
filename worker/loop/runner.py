"""run: the engine on its own thread, so polling and batching go on while it computes.

The worker loop hands over one batch at a time (:meth:`EngineRunner.submit`) and picks
up what finished with :meth:`EngineRunner.drain`. A batch that raises is split in
halves and retried, down to single requests, which then fail alone with 5000: one bad
request never takes its batch-mates with it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from worker.engines.base import Completion, EngineInput, EngineOutOfMemory, StaticEngine
from worker.errors import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    """One request done, with the run (submitted batch) it was part of."""

    completion: Completion
    run_id: int
    finished_at: float  # monotonic


@dataclass(frozen=True)
class BatchDone:
    """A submitted batch has fully finished (every request reported)."""

    run_id: int
    engine_s: float
    out_of_memory: int  # how many times a part of it ran out of memory


Event = Finished | BatchDone


class EngineRunner:
    """One engine thread; at most one batch runs at a time."""

    def __init__(self, engine: StaticEngine) -> None:
        self._engine = engine
        self._inbox: queue.Queue[tuple[int, Sequence[EngineInput]] | None] = queue.Queue()
        self._events: queue.Queue[Event] = queue.Queue()
        self._lock = threading.Lock()
        self._running: tuple[int, float] | None = None  # (run id, started at)
        self._next_id = 0
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    def running_since(self) -> float | None:
        with self._lock:
            return self._running[1] if self._running else None

    def submit(self, inputs: Sequence[EngineInput]) -> int:
        """Hand ``inputs`` to the engine thread; returns the run id its events carry."""
        with self._lock:
            self._next_id += 1
            run_id = self._next_id
            # marked running now, not when the thread picks it up: the hang watchdog counts
            # from the hand-over
            self._running = (run_id, time.monotonic())
        self._inbox.put((run_id, inputs))
        return run_id

    def drain(self, timeout_s: float = 0.0) -> list[Event]:
        """Events so far; waits up to ``timeout_s`` for the first one."""
        events: list[Event] = []
        try:
            events.append(
                self._events.get(timeout=timeout_s) if timeout_s else self._events.get_nowait()
            )
            while True:
                events.append(self._events.get_nowait())
        except queue.Empty:
            pass
        return events

    def stop(self, timeout_s: float = 5.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            run_id, inputs = item
            started = time.monotonic()
            ooms = self._run_split(run_id, inputs)
            with self._lock:
                self._running = None
            self._events.put(BatchDone(run_id, time.monotonic() - started, ooms))

    def _run_split(self, run_id: int, inputs: Sequence[EngineInput]) -> int:
        """Run ``inputs``; on failure retry each half. Returns the out-of-memory count."""
        done: set[str] = set()

        def on_complete(completion: Completion) -> None:
            done.add(completion.key)
            self._events.put(Finished(completion, run_id, time.monotonic()))

        try:
            self._engine.run_batch(inputs, on_complete)
            return 0
        except Exception as exc:
            oom = isinstance(exc, EngineOutOfMemory)
            rest = [i for i in inputs if i.key not in done]
            if len(rest) <= 1:
                for item in rest:
                    log.warning("engine failed on %s: %s", item.key, exc)
                    on_complete(_failure(item, exc))
                return int(oom)
            log.warning("batch of %d failed (%s); retrying in halves", len(rest), exc)
            mid = len(rest) // 2
            return (
                int(oom) + self._run_split(run_id, rest[:mid]) + self._run_split(run_id, rest[mid:])
            )


def _failure(item: EngineInput, exc: BaseException) -> Completion:
    message = f"engine failed: {type(exc).__name__}: {exc}"
    return Completion.failed(item.key, ErrorCode.ENGINE_FAILED, message, len(item.prompt_token_ids))
