"""A batch's life after ``POST /v1/batches``, driven by every server replica.

``validating`` → the input file's requests are published whole (as ``batchpipe submit``
publishes them: with fair share without a transaction, run only once their end marker
is read; else in one transaction) → ``in_progress`` → once every request is answered,
``finalizing`` → the output and error files are assembled (:mod:`batchpipe.api.assemble`)
→ ``completed``. A file whose lines address another endpoint than the batch's ends
``failed``, with ``errors.data`` naming the lines. Past ``expires_at`` an unfinished batch
is stopped (control topic, 4006) and ends ``expired``. A batch whose model has no route
(``kafka.routes`` changed since it was created) ends ``failed`` naming the model; one
asking for ``priority`` from a key whose allowance is now 0 (``scheduling.priority_shares``
changed since) ends ``failed`` naming ``metadata.batchpipe_tier``. A cancel
writes ``cancelling`` and a stop record that every worker reads (4005); the batch ends
``cancelled`` once every request is answered, or ``api.cancel_grace_s`` after the cancel,
whichever comes first. A batch whose spend reaches its cap (:mod:`batchpipe.api.costcap`)
takes the cancel's path with reason ``capped``: ``cancelling`` with ``errors.data`` naming
the cap, a stop record (4008 ``batch_cap_reached``), then ``cancelled``.

Progress is counted from the results topic by :class:`~batchpipe.api.follow.
ResultsFollower`. Every change of a batch's state is decided and written under one lock
(a cancel too), so a batch cannot both end and be cancelled. A cancel writes
``cancelling`` first and then announces the stop in the background; one that fails is retried
by the loop, as is every ``cancelling`` batch's after a restart (a stop is idempotent).

Each step also removes the files that have expired (:mod:`batchpipe.api.retention`).
Each batch is advanced on its own: one that fails (its input file deleted by another
replica, say) fails alone — ``failed`` with the reason in ``errors.data`` when its input
is gone, retried on the next step otherwise — and never stops the others.

Nothing here outlives a restart that Kafka does not hold: a new server
(or a second replica) finds the unfinished batches on the state topic, counts their
results again, publishes a ``validating`` batch again (an earlier attempt cut short has no
end marker, or its transaction is fenced by the same transactional id; what of it is run
with the new one is answered twice, and readers count each ``custom_id`` once) and ends
each batch in turn.
Two replicas may both end the same batch: the files have ids derived from the batch id,
so they write the same files.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from confluent_kafka import KafkaException

from batcher.tiers import TierRefusedError
from batchpipe.api import retention
from batchpipe.api.answerlog import answers_dir, answers_root
from batchpipe.api.assemble import assemble
from batchpipe.api.feederwatch import NO_FEEDER_CODE, NO_FEEDER_S, FeederWatch
from batchpipe.api.follow import ResultsFollower
from batchpipe.api.linecheck import line_problems
from batchpipe.api.records import BatchRecord, Counts, Usage
from batchpipe.api.retention import Retention
from batchpipe.api.state import KafkaUnavailable, StaleRecord, StateTopic
from batchpipe.api.store import FileStore
from batchpipe.api.tiers import TIER_METADATA, published_tier
from batchpipe.api.weights import published_weight
from batchpipe.batchfile import FileLimits
from batchpipe.client import Client
from batchpipe.collect import BatchTally
from worker.config import Config
from worker.kafka.cancellations import Announcer, Reason, Stop
from worker.routing import UnroutedModelError

log = logging.getLogger("batchpipe.api")

_ANNOUNCE_TIMEOUT_S = 5.0  # a cancel's stop record; the loop retries it


_RUNNING = ("validating", "in_progress")  # a batch its cap can stop


def _now() -> int:
    return int(time.time())


def _stop_reason(batch: BatchRecord) -> Reason:
    """Why a ``cancelling`` batch stops: its cap, or its owner's cancel."""
    return "capped" if batch.cap is not None and batch.cap.reached_at is not None else "cancelled"


class Lifecycle:
    def __init__(
        self, config: Config, state: StateTopic, store: FileStore, limits: FileLimits
    ) -> None:
        self._config = config
        self._state = state
        self._store = store
        self._limits = limits
        self.results = ResultsFollower(config, answers_dir(config.api))
        self.retention = Retention(state, store, answers_root(config.api))
        self.feeders = FeederWatch(config)
        self._publishing: set[str] = set()
        self._announced: set[str] = set()  # cancelled batches whose stop the broker has
        self._announcer = Announcer(config.kafka)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="api-publish")
        self._lock = threading.RLock()  # one change of a batch's state at a time
        self._publish_lock = threading.Lock()  # never held over a Kafka call
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-lifecycle", daemon=True)

    def start(self) -> None:
        self._announcer.open()  # ready before the first stop: a cap's stop waits on nothing
        self._thread.start()
        self.feeders.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._announcer.close()
        self.results.stop()
        self.feeders.close()

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive()

    # -- what the routes ask ----------------------------------------------------------

    def progress(self, batch: BatchRecord) -> tuple[Counts, Usage | None]:
        """Live counts and usage of a batch that has not ended; the recorded ones after."""
        tally = self.results.tally(batch.id)
        if batch.terminal or tally is None:
            return batch.counts, batch.usage
        counts = Counts(batch.counts.total, tally.completed, tally.failed)
        usage = Usage(tally.prompt_tokens, tally.completion_tokens, tally.reasoning_tokens)
        return counts, usage

    def created(self, batch: BatchRecord) -> None:
        """A batch this replica just created: its results are counted from the reader's
        position (none can be behind it yet) and its requests published."""
        self.results.register(batch)
        self.publish(batch)

    def publish(self, batch: BatchRecord) -> None:
        """Publish a ``validating`` batch's requests in the background."""
        with self._publish_lock:
            if batch.id in self._publishing:
                return
            self._publishing.add(batch.id)
        self._pool.submit(self._publish, batch.id)

    def cancel(self, batch_id: str) -> tuple[BatchRecord, bool]:
        """Mark the batch ``cancelling`` and stop it on every worker; with False (and the
        batch as it is) when it is finalizing or has ended. ``cancelling`` stays as it is."""
        with self._lock:
            try:
                batch, changed = self._cancel(batch_id)
            except StaleRecord:  # another replica changed it: decide again on what it wrote
                batch, changed = self._cancel(batch_id)
        if not changed:
            return batch, batch.status == "cancelling"
        # in the background: the answer waits for the state write only, never for the
        # control topic; the loop retries an announcement that failed
        self._pool.submit(self._announce_stop, batch)
        return batch, True

    def _cancel(self, batch_id: str) -> tuple[BatchRecord, bool]:
        """The batch, and whether this call made it ``cancelling``."""
        batch = self._state.batch(batch_id)
        if batch is None:
            raise KeyError(batch_id)
        if batch.status not in ("validating", "in_progress"):
            return batch, False
        return self._state.put_batch(
            replace(batch, status="cancelling", cancelling_at=_now())
        ), True

    def _cap_reached(self, batch_id: str, param: str, tally: BatchTally) -> BatchRecord | None:
        """Stop a running batch at its cap: ``cancelling`` with the cap in ``errors.data``
        (under the lock, as a cancel), then its stop record. None when it had changed."""
        with self._lock:
            batch = self._state.batch(batch_id)
            if batch is None or batch.cap is None or batch.status not in _RUNNING:
                return None
            now = _now()
            stopped = replace(
                batch,
                status="cancelling",
                cancelling_at=now,
                cap=batch.cap.stopped(now),
                errors=(*batch.errors, batch.cap.error(param, tally)),
            )
            batch = self._state.put_batch(stopped)
        start = time.monotonic()
        self._announce_stop(batch)  # at once: every answer until the workers read it is over
        log.info(
            "batch %s reached its cap (%s): stop announced in %.0f ms",
            batch.id,
            param,
            (time.monotonic() - start) * 1000,
        )
        return batch

    def _announce_stop(self, batch: BatchRecord) -> None:
        """Tell every worker the batch is stopped; a failure is retried by the loop."""
        try:
            self._announce(Stop(batch.id, _stop_reason(batch), time.time()))
        except Exception as exc:  # on a pool thread: logged here or never
            log.warning("batch %s: the stop was not announced, retrying: %r", batch.id, exc)
            return
        self._announced.add(batch.id)

    def _announce(self, stop: Stop) -> None:
        self._announcer.announce(stop, timeout_s=_ANNOUNCE_TIMEOUT_S)

    # -- publishing -------------------------------------------------------------------

    def _publish(self, batch_id: str) -> None:
        try:
            self._validate_and_publish(batch_id)
        except FileNotFoundError:
            self._input_gone(batch_id)
        except Exception as exc:  # Kafka down, say: one line per try, not a traceback
            log.warning("publishing batch %s failed, retrying on the next step: %r", batch_id, exc)
        finally:
            with self._publish_lock:
                self._publishing.discard(batch_id)

    def _validate_and_publish(self, batch_id: str) -> None:
        batch = self._state.batch(batch_id)
        if batch is None or batch.status != "validating":
            return
        with self._store.local_copy(batch.input_file_id) as path:
            errors = self._line_problems(path, batch.endpoint)
            if errors:
                self._transition(batch_id, "validating", status="failed", errors=tuple(errors))
                return
            try:
                Client(self._config, limits=self._limits).publish_file(
                    path,
                    batch.counts.total,
                    batch.id,
                    (batch.model,),
                    weight=published_weight(self._config, batch.owner, batch.metadata),
                    key=batch.owner,
                    tier=published_tier(self._config, batch.owner, batch.metadata),
                )
            except UnroutedModelError as exc:
                self._fail(batch_id, "validating", str(exc.code), str(exc), "model")
                return
            except TierRefusedError as exc:  # nothing was published
                param = f"metadata.{TIER_METADATA}"
                self._fail(batch_id, "validating", "priority_not_allowed", str(exc), param)
                return
        self._transition(batch_id, "validating", status="in_progress")

    def _fail(self, batch_id: str, was: str, code: str, message: str, param: str) -> None:
        """The batch, if still ``was``, ends ``failed`` with one error naming ``param``
        (not a line of its input)."""
        error = {"code": code, "message": message, "param": param, "line": None}
        self._transition(batch_id, was, status="failed", errors=(error,))

    def _line_problems(self, path: Path, endpoint: str) -> list[dict[str, object]]:
        return line_problems(path, endpoint, self._limits, self._config.api.max_priority)

    def _transition(self, batch_id: str, expected: str, **changes: object) -> BatchRecord | None:
        """Write ``changes`` (and the ``<status>_at`` time) if the batch is still ``expected``."""
        with self._lock:
            batch = self._state.batch(batch_id)
            if batch is None or batch.status != expected:
                return None
            status = str(changes["status"])
            stamped = {f"{status}_at": _now(), **changes}
            return self._state.put_batch(replace(batch, **stamped))  # type: ignore[arg-type]

    def _input_gone(self, batch_id: str) -> None:
        """The batch's input file is gone from the store (deleted through another
        replica, or by hand): the batch cannot be published or assembled, so it fails,
        saying why."""
        batch = self._state.batch(batch_id)
        if batch is None or batch.terminal:
            return
        message = (
            f"the input file {batch.input_file_id} was deleted before the batch ended; its "
            "results cannot be assembled"
        )
        log.warning("batch %s failed: input file %s is gone", batch.id, batch.input_file_id)
        self._fail(batch.id, batch.status, "input_file_missing", message, "input_file_id")

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        interval = self._config.api.poll_interval_ms / 1000
        wait = interval
        while not self._stop.wait(wait):
            wait = interval
            try:
                if self._step():
                    wait = 0.0  # the read stopped at a finished batch: more may be behind it
            except (KafkaException, KafkaUnavailable, OSError) as exc:
                log.warning("batch lifecycle step failed, retrying: %s", exc)
                self.results.close()

    def _step(self) -> bool:
        """One pass over the batches; True when the results read stopped early at a batch
        that is complete (it ends in this pass) and more may be waiting to be read, or a
        batch under a cap runs."""
        active = [b for b in self._state.batches() if not b.terminal]
        for batch in active:
            if batch.status == "validating":
                self.publish(batch)
            elif batch.status == "cancelling" and batch.id not in self._announced:
                self._announce_stop(batch)
        read_on = self.results.follow(active)
        now = time.time()
        for batch in active:
            # each batch on its own: one that cannot advance never holds up the others
            try:
                self._advance(batch, now)
            except FileNotFoundError:
                self._input_gone(batch.id)
            except Exception as exc:
                log.warning("batch %s: step failed, retrying on the next: %r", batch.id, exc)
        self.retention.step(retention.now())
        # a batch under a cap is followed without a pause: the poll interval would add to
        # its overshoot (the read window, 0.2 s at most, paces the loop instead)
        return read_on or any(
            b.cap is not None and b.cap.limits and b.status in _RUNNING for b in active
        )

    def _advance(self, batch: BatchRecord, now: float) -> None:
        tally = self.results.tally(batch.id)
        done = tally is not None and tally.complete
        over = None if tally is None or batch.cap is None else batch.cap.reached(tally)
        if batch.status in ("in_progress", "finalizing") and done:
            self._end(batch, "completed", None)
        elif batch.status in _RUNNING and over is not None and tally is not None:
            self._cap_reached(batch.id, over, tally)
        elif batch.status == "in_progress" and now >= batch.expires_at:
            stop = Stop(batch.id, "expired", now)
            self._announce(stop)
            self._end(batch, "expired", stop)
        elif batch.status == "cancelling" and (
            done or now >= (batch.cancelling_at or 0) + self._config.api.cancel_grace_s
        ):
            self._end(batch, "cancelled", Stop(batch.id, _stop_reason(batch), now))
        elif batch.status == "in_progress" and now - (batch.in_progress_at or now) >= NO_FEEDER_S:
            why = self.feeders.stalled(now)
            if why is not None and (tally is None or tally.completed + tally.failed == 0):
                self._fail(batch.id, "in_progress", NO_FEEDER_CODE, why, "scheduling.fair")

    def _end(self, batch: BatchRecord, status: str, stop: Stop | None) -> None:
        if status == "completed" and batch.status == "in_progress":
            moved = self._transition(batch.id, "in_progress", status="finalizing")
            if moved is None:
                return
            batch = moved
        created = _now()
        with self._store.local_copy(batch.input_file_id) as path:
            files = assemble(
                self._config,
                batch,
                path,
                self._store,
                self._limits,
                self.results.answers(batch),
                stop=stop,
                created_at=created,
            )
        for record in (files.output, files.errors):
            if record is not None:
                self._state.put_file(record, idempotent=True)
        self._transition(
            batch.id,
            batch.status,
            status=status,
            counts=files.counts,
            usage=files.usage,
            output_file_id=files.output.id if files.output else None,
            error_file_id=files.errors.id if files.errors else None,
        )
        log.info("batch %s %s: %s", batch.id, status, files.counts)
