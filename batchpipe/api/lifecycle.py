"""A batch's life after ``POST /v1/batches``, driven by every server replica.

``validating`` → the input file's requests are published in one transaction (as
``batchpipe submit`` publishes them) → ``in_progress`` → once every request is answered,
``finalizing`` → the output and error files are assembled (:mod:`batchpipe.api.assemble`)
→ ``completed``. A file whose lines address another endpoint than the batch's ends
``failed``, with ``errors.data`` naming the lines. Past ``expires_at`` an unfinished batch
is stopped (control topic, 4006) and ends ``expired``. A batch whose model has no route
(``kafka.routes`` changed since it was created) ends ``failed`` naming the model. A cancel
writes ``cancelling`` and a stop record that every worker reads (4005); the batch ends
``cancelled`` once every request is answered, or ``api.cancel_grace_s`` after the cancel,
whichever comes first.

Progress is counted from the results topic: one read_committed reader follows it from the
earliest submit time of the batches that have not ended, and a tally per batch counts each
``custom_id`` once. Nothing here outlives a restart that Kafka does not hold: a new server
(or a second replica) finds the unfinished batches on the state topic, counts their
results again, publishes a ``validating`` batch again (the same transactional id fences
the earlier publisher; readers count each ``custom_id`` once) and ends each batch in turn.
Two replicas may both end the same batch: the files have ids derived from the batch id,
so they write the same files.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from confluent_kafka import Consumer, KafkaException

from batchpipe.api.assemble import assemble
from batchpipe.api.records import ENDPOINTS, BatchRecord, Counts, Usage
from batchpipe.api.state import StateTopic
from batchpipe.api.store import FileStore
from batchpipe.batchfile import FileLimits, iter_file
from batchpipe.client import Client
from batchpipe.collect import BatchTally, batch_time, open_reader, record_headers, records
from worker.cancellations import Stop, announce
from worker.config import Config
from worker.errors import ErrorCode, RequestError
from worker.routing import UnroutedModelError
from worker.wire.codec import CodecLimits, decode_result

log = logging.getLogger("batchpipe.api")

_MAX_ERRORS = 100  # lines named in a failed batch's errors.data
_READ_S = 0.2  # longest a step spends reading results


def _now() -> int:
    return int(time.time())


class Lifecycle:
    def __init__(
        self, config: Config, state: StateTopic, store: FileStore, limits: FileLimits
    ) -> None:
        self._config = config
        self._state = state
        self._store = store
        self._limits = limits
        self._codec_limits = CodecLimits.from_config(config.limits)
        self._tallies: dict[str, BatchTally] = {}
        self._reader: tuple[Consumer, int] | None = None
        self._publishing: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="api-publish")
        self._lock = threading.RLock()  # one change of a batch's state at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-lifecycle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._close_reader()

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive()

    # -- what the routes ask ----------------------------------------------------------

    def progress(self, batch: BatchRecord) -> tuple[Counts, Usage | None]:
        """Live counts and usage of a batch that has not ended; the recorded ones after."""
        tally = self._tallies.get(batch.id)
        if batch.terminal or tally is None:
            return batch.counts, batch.usage
        counts = Counts(batch.counts.total, tally.completed, tally.failed)
        usage = Usage(tally.prompt_tokens, tally.completion_tokens, tally.reasoning_tokens)
        return counts, usage

    def publish(self, batch: BatchRecord) -> None:
        """Publish a ``validating`` batch's requests in the background."""
        with self._lock:
            if batch.id in self._publishing:
                return
            self._publishing.add(batch.id)
        self._pool.submit(self._publish, batch.id)

    def cancel(self, batch_id: str) -> BatchRecord:
        """Stop the batch on every worker and mark it ``cancelling``."""
        with self._lock:
            batch = self._state.batch(batch_id)
            assert batch is not None
            if batch.status in ("cancelling", "cancelled"):
                return batch
            announce(self._config.kafka, Stop(batch.id, "cancelled", time.time()))
            return self._state.put_batch(replace(batch, status="cancelling", cancelling_at=_now()))

    # -- publishing -------------------------------------------------------------------

    def _publish(self, batch_id: str) -> None:
        try:
            self._validate_and_publish(batch_id)
        except Exception:
            log.exception("publishing batch %s failed; retrying on the next step", batch_id)
        finally:
            with self._lock:
                self._publishing.discard(batch_id)

    def _validate_and_publish(self, batch_id: str) -> None:
        batch = self._state.batch(batch_id)
        if batch is None or batch.status != "validating":
            return
        with self._store.local_copy(batch.input_file_id) as path:
            errors = self._wrong_endpoint(path, batch.endpoint)
            if errors:
                self._transition(batch_id, "validating", status="failed", errors=tuple(errors))
                return
            try:
                Client(self._config, limits=self._limits).publish_file(
                    path, batch.counts.total, batch.id, (batch.model,)
                )
            except UnroutedModelError as exc:
                error = {"code": str(exc.code), "message": str(exc), "param": "model", "line": None}
                self._transition(batch_id, "validating", status="failed", errors=(error,))
                return
        self._transition(batch_id, "validating", status="in_progress")

    def _wrong_endpoint(self, path: object, endpoint: str) -> list[dict[str, object]]:
        kind = ENDPOINTS[endpoint]
        errors: list[dict[str, object]] = []
        for line, req in enumerate(iter_file(path, self._limits), start=1):  # type: ignore[arg-type]
            if req.endpoint != kind and len(errors) < _MAX_ERRORS:
                errors.append(
                    {
                        "code": str(int(ErrorCode.INVALID_PARAMETER)),
                        "message": f"the line addresses another endpoint than the batch's "
                        f"{endpoint}",
                        "param": "url",
                        "line": line,
                    }
                )
        return errors

    def _transition(self, batch_id: str, expected: str, **changes: object) -> BatchRecord | None:
        """Write ``changes`` (and the ``<status>_at`` time) if the batch is still ``expected``."""
        with self._lock:
            batch = self._state.batch(batch_id)
            if batch is None or batch.status != expected:
                return None
            status = str(changes["status"])
            stamped = {f"{status}_at": _now(), **changes}
            return self._state.put_batch(replace(batch, **stamped))  # type: ignore[arg-type]

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        interval = self._config.api.poll_interval_ms / 1000
        while not self._stop.wait(interval):
            try:
                self._step()
            except (KafkaException, OSError) as exc:
                log.warning("batch lifecycle step failed, retrying: %s", exc)
                self._close_reader()

    def _step(self) -> None:
        active = [b for b in self._state.batches() if not b.terminal]
        for batch in active:
            if batch.status == "validating":
                self.publish(batch)
        self._follow([b for b in active if b.status != "validating"])
        now = time.time()
        for batch in active:
            tally = self._tallies.get(batch.id)
            done = tally is not None and tally.complete
            if batch.status in ("in_progress", "finalizing") and done:
                self._end(batch, "completed", None)
            elif batch.status == "in_progress" and now >= batch.expires_at:
                stop = Stop(batch.id, "expired", now)
                announce(self._config.kafka, stop)
                self._end(batch, "expired", stop)
            elif batch.status == "cancelling" and (
                done or now >= (batch.cancelling_at or 0) + self._config.api.cancel_grace_s
            ):
                self._end(batch, "cancelled", Stop(batch.id, "cancelled", now))

    def _end(self, batch: BatchRecord, status: str, stop: Stop | None) -> None:
        if status == "completed" and batch.status == "in_progress":
            moved = self._transition(batch.id, "in_progress", status="finalizing")
            if moved is None:
                return
            batch = moved
        created = _now()
        with self._store.local_copy(batch.input_file_id) as path:
            files = assemble(
                self._config, batch, path, self._store, self._limits, stop=stop, created_at=created
            )
        for record in (files.output, files.errors):
            if record is not None:
                self._state.put_file(record)
        self._transition(
            batch.id,
            batch.status,
            status=status,
            counts=files.counts,
            usage=files.usage,
            output_file_id=files.output.id if files.output else None,
            error_file_id=files.errors.id if files.errors else None,
        )
        self._tallies.pop(batch.id, None)
        log.info("batch %s %s: %s", batch.id, status, files.counts)

    def _follow(self, tracked: list[BatchRecord]) -> None:
        """Count the results of ``tracked`` batches; a new batch restarts the reader at the
        earliest submit time, and the counts from there (each custom_id counts once)."""
        ids = {b.id for b in tracked}
        for gone in set(self._tallies) - ids:
            del self._tallies[gone]
        if ids - set(self._tallies):
            self._tallies = {b.id: BatchTally(b.id, b.counts.total) for b in tracked}
            self._close_reader()
        if not self._tallies:
            return
        if self._reader is None:
            starts = [batch_time(b.id) for b in tracked]
            since = None if None in starts else min(s for s in starts if s is not None)
            kafka = self._config.kafka
            self._reader = open_reader(kafka, kafka.results_topic, since)
        consumer, partitions = self._reader
        deadline = time.monotonic() + _READ_S
        for msg in records(consumer, partitions, until_end=False, deadline=deadline):
            try:
                result = decode_result(msg.value(), record_headers(msg), self._codec_limits)
            except RequestError:
                continue
            tally = self._tallies.get(result.batch_id)
            if tally is not None:
                tally.add(result)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader[0].close()
            self._reader = None
