"""Claiming the transactional ids of newly assigned partitions, retried until it succeeds.

On each assignment the worker calls ``init_transactions`` on the id of every partition it
was given (docs/architecture.md §2 "Which transactional.id"): that fences whoever used the
id before and aborts the transaction it left open. On a broker that never times a
transaction out (the embedded Tansu) a claim that failed would leave that transaction
open for good, holding back every read_committed reader of the results partitions it
wrote. So a failed claim is retried on a timer, with back-off (:data:`FIRST_RETRY_S`
doubling to :data:`MAX_RETRY_S`), for as long as the partition is this worker's.

A retry never runs once its partition is released: :meth:`Reclaimer.release` cancels the
retries of those ids and waits for one in progress, and the revoke that calls it ends
before the group assigns the partition to its next owner (eager rebalancing), so the
worker never fences a newer owner's producer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

from worker.kafka.failures import Abortable, FatalKafkaError, GenerationLost, call
from worker.kafka.produce import ProducerFactory

log = logging.getLogger(__name__)

#: producers calling ``init_transactions`` at once on the ids of newly assigned partitions
_CLAIMERS = 16
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0
_TIMEOUT_S = 30.0


class Reclaimer:
    """Claims ids (:meth:`claim`) and retries the ones that failed until released."""

    def __init__(self, producers: ProducerFactory) -> None:
        self._producers = producers
        self._lock = threading.Lock()  # guards _pending and _timer; held during a retry
        self._pending: dict[str, float] = {}  # id → the back-off before its next retry
        self._timer: threading.Timer | None = None

    @property
    def pending(self) -> set[str]:
        """Ids whose claim failed and waits for a retry."""
        with self._lock:
            return set(self._pending)

    def claim(self, transactional_ids: Collection[str]) -> None:
        """``init_transactions`` on each id, in parallel; the failed ones are retried."""
        failed = self._claim(transactional_ids)
        if failed:
            with self._lock:
                for transactional_id in failed:
                    self._pending.setdefault(transactional_id, FIRST_RETRY_S)
                self._schedule()

    def release(self, transactional_ids: Collection[str]) -> None:
        """Their partitions are no longer this worker's: no retry of these ids runs after
        this returns."""
        with self._lock:  # waits for a retry in progress
            for transactional_id in transactional_ids:
                self._pending.pop(transactional_id, None)
            if not self._pending and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def close(self) -> None:
        with self._lock:
            self._pending.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _schedule(self) -> None:
        """With the lock held: the next retry round, after the shortest back-off due."""
        if self._timer is not None or not self._pending:
            return
        self._timer = threading.Timer(min(self._pending.values()), self._retry)
        self._timer.daemon = True
        self._timer.start()

    def _retry(self) -> None:
        with self._lock:
            self._timer = None
            ids = list(self._pending)
            if not ids:
                return
            failed = self._claim(ids)
            for transactional_id in ids:
                if transactional_id in failed:
                    backoff = self._pending[transactional_id]
                    self._pending[transactional_id] = min(2 * backoff, MAX_RETRY_S)
                else:
                    del self._pending[transactional_id]
                    log.info("claimed %s on a retry", transactional_id)
            self._schedule()

    def _claim(self, transactional_ids: Collection[str]) -> set[str]:
        """The ids whose ``init_transactions`` failed."""

        def init(transactional_id: str) -> str | None:
            try:
                call(self._producers(transactional_id).init_transactions, _TIMEOUT_S)
                return None
            except (Abortable, FatalKafkaError, GenerationLost) as exc:
                log.warning("init_transactions on %s failed, retried: %s", transactional_id, exc)
                return transactional_id

        if not transactional_ids:
            return set()
        with ThreadPoolExecutor(min(_CLAIMERS, len(transactional_ids))) as pool:
            return {i for i in pool.map(init, transactional_ids) if i is not None}
