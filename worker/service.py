"""The worker: poll → decode → admit → batch → run → publish → commit, until stopped.

One thread owns Kafka, the batcher and the offsets; the engine runs on its own thread
(:mod:`worker.runner`), so the loop keeps polling, decoding and forming the next batch
while a batch computes. Every consumed record is answered exactly once — a result, an
error result or a dead letter — before its offset can be committed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from batcher import (
    AdaptiveBatchSize,
    Admission,
    Batch,
    BatchLimits,
    DynamicBatcher,
    OffsetTracker,
    Partition,
    Pending,
)
from worker import __version__, clients
from worker.codec import CodecLimits, encode_result
from worker.config import Config
from worker.engines.base import Engine
from worker.engines.factory import create_engine
from worker.errors import ErrorCode, ModelLoadError
from worker.health import Health, MetricsServer
from worker.intake import DeadLetter, Intake
from worker.jobs import Identity, Job, Source, completed, failed
from worker.logs import SummaryLogger
from worker.messages import InferenceResult
from worker.metrics import WorkerMetrics
from worker.publisher import (
    AtLeastOncePublisher,
    FatalKafkaError,
    Publisher,
    TransactionAborted,
    TransactionalPublisher,
    rewind,
)
from worker.runner import BatchDone, EngineRunner, Finished

log = logging.getLogger("batchpipe.worker")

EXIT_OK, EXIT_FATAL, EXIT_MODEL_LOAD = 0, 1, 3
_MAX_POLL_BATCH = 500


@dataclass
class _Running:
    """The batch in the engine: what it holds and when it went in."""

    runner_id: int
    batch: Batch[Job]
    dispatched_at: float


class Worker:
    def __init__(self, config: Config, engine: Engine | None = None) -> None:
        self.config = config
        self.worker_id = config.worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.engine = engine or create_engine(config.engine, config.generation, config.batching)
        self.identity = Identity(worker_id=self.worker_id, model=self.engine.model_name)
        b = config.batching
        self.metrics = WorkerMetrics(
            model=self.engine.model_name,
            engine=config.engine.kind,
            version=__version__,
            prefetch_limit=b.prefetch_count,
        )
        self.health = Health(metrics=self.metrics)
        self.server = MetricsServer(config.metrics, self.metrics, self.health)
        self.batcher: DynamicBatcher[Job] = DynamicBatcher(
            BatchLimits(
                max_batch_size=b.max_batch_size,
                max_batch_tokens=b.max_batch_tokens,
                timeout_s=b.timeout_ms / 1000.0,
                length_aware=b.length_aware,
                shared_prefix=b.shared_prefix,
            ),
            dedup=b.dedup,
        )
        self.admission = Admission(b.prefetch_count)
        self.tracker = OffsetTracker()
        self.adaptive = AdaptiveBatchSize(
            b.max_batch_size, b.max_batch_size, interval_s=b.adaptive_interval_ms / 1000.0
        )
        self.intake = Intake(
            self.engine,
            self.identity,
            b,
            config.generation,
            CodecLimits.from_config(config.limits),
        )
        self._open: set[str] = set()  # source refs admitted and not yet answered
        self._running: _Running | None = None
        self._wedged = False
        self._next_adapt = 0.0
        self._paused = False
        self._stop = threading.Event()
        self._summary = SummaryLogger(log)
        self._consumer: Consumer | None = None
        self._publisher: Publisher | None = None
        self._runner: EngineRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to drain and exit (signal handlers call this)."""
        self._stop.set()

    def run(self) -> int:
        if self.config.metrics.enabled:
            self.server.start()
            log.info("metrics on %s", self.server.url)
        try:
            self.engine.load()
        except ModelLoadError as exc:
            self.health.set_model_loaded(False, str(exc))
            log.error("%d model failed to load: %s", ErrorCode.MODEL_LOAD_FAILED, exc)
            self._shutdown()
            return EXIT_MODEL_LOAD
        self.health.set_model_loaded(True)
        try:
            self._start_kafka()
            self._loop()
            return EXIT_OK
        except FatalKafkaError as exc:
            log.error("fatal Kafka error, exiting: %s", exc)
            return EXIT_FATAL
        finally:
            self._shutdown()

    def _start_kafka(self) -> None:
        k = self.config.kafka
        clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
        self._consumer = clients.consumer(
            k,
            extra={"statistics.interval.ms": 5000, "stats_cb": self.metrics.observe_kafka_stats},
        )
        if k.delivery == "exactly_once":
            prefix = f"batchpipe.{k.group_id}"
            self._publisher = TransactionalPublisher(
                k, self._consumer, self.tracker, prefix, on_outcome=self.metrics.transaction
            )
        else:
            self._publisher = AtLeastOncePublisher(k, self._consumer, self.tracker)
        self.health.set_producer_ok(True)
        self._consumer.subscribe(
            [k.requests_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self.health.set_consumer_ok(True, "waiting for assignment")
        self._runner = EngineRunner(self.engine)
        log.info(
            "worker %s serving %r from %s (delivery %s)",
            self.worker_id,
            self.engine.model_name,
            k.requests_topic,
            k.delivery,
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._step(draining=False)
        self._drain()

    def _step(self, draining: bool) -> None:
        now = time.monotonic()
        self.health.beat()
        for message in self._poll(draining):
            self._decode_admit(message, now)
        self._expire(now)
        self._collect()
        self._dispatch(now, flush=draining)
        self._publish_and_commit(now)
        self._adapt(now)
        self._flow()
        self._summary.maybe_log(now, self.metrics.snapshot())

    def _drain(self) -> None:
        """Stop taking records; finish what is in flight up to ``drain_timeout_s``."""
        assert self._consumer is not None
        self._pause(True)
        deadline = time.monotonic() + self.config.worker.drain_timeout_s
        while self._open and time.monotonic() < deadline and not self._wedged:
            self._step(draining=True)
        if self._open:
            log.warning("drain timed out with %d requests unanswered", len(self._open))

    def _shutdown(self) -> None:
        if self._consumer is not None:
            try:
                if self._publisher is not None:
                    self._publisher.commit()
            except (TransactionAborted, FatalKafkaError) as exc:
                log.warning("final commit failed: %s", exc)
            self._consumer.close()  # leaves the group now, not after session.timeout.ms
        if self._publisher is not None:
            self._publisher.close()
        if self._runner is not None:
            self._runner.stop()
        self.engine.close()
        self.server.stop()

    # -- the verbs ---------------------------------------------------------------------

    def _poll(self, draining: bool) -> list[Message]:
        assert self._consumer is not None and self._runner is not None
        room = 0 if draining else min(self.admission.room, _MAX_POLL_BATCH)
        if self._runner.busy:
            timeout = 0.005  # notice finished requests quickly
        else:
            wake = self.batcher.wake_at()
            timeout = 0.1 if wake is None else min(0.1, max(0.0, wake - time.monotonic()))
        if room <= 0:
            # keep serving the group protocol and callbacks while paused
            self._consumer.poll(timeout)
            return []
        messages = self._consumer.consume(num_messages=room, timeout=timeout)
        good = []
        for m in messages:
            error = m.error()
            if error is None:
                good.append(m)
            elif error.code() != KafkaError._PARTITION_EOF:
                if error.fatal():
                    raise FatalKafkaError(f"consumer: {error}")
                log.warning("consumer error: %s", error)
        return good

    def _decode_admit(self, message: Message, now: float) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        _, timestamp_ms = message.timestamp()
        source = Source(
            topic,
            partition,
            offset,
            message.key() if isinstance(message.key(), bytes) else None,
            timestamp_ms / 1000.0 if timestamp_ms > 0 else None,
        )
        self.tracker.add((topic, partition), offset)
        self.admission.acquire()
        self._open.add(source.ref)
        with self.metrics.stage("decode"):
            headers = message.headers()  # a list on consumed records (a dict only when producing)
            assert not isinstance(headers, dict)
            outcome = self.intake.take(source, message.value(), headers, now)
        if isinstance(outcome, Pending):
            if self.batcher.add(outcome, now):
                self.metrics.dedup_hit()
        elif isinstance(outcome, DeadLetter):
            self._dead_letter(outcome)
        else:
            self._answer(outcome.result, source, submitted_at=outcome.submitted_at)

    def _expire(self, now: float) -> None:
        for item in self.batcher.pop_expired(now):
            self._fail(item, ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request ran")

    def _dispatch(self, now: float, flush: bool) -> None:
        assert self._runner is not None
        if self._wedged or self._runner.busy:
            return
        with self.metrics.stage("batch"):
            batch = self.batcher.next_batch(now, flush=flush)
        if batch is None:
            return
        runner_id = self._runner.submit([item.payload.engine_input for item in batch.items])
        self._running = _Running(runner_id, batch, now)
        log.debug(
            "batch %d: %d requests, %d tokens, %s",
            runner_id,
            batch.size,
            batch.tokens,
            batch.reason,
            extra={"batch_size": batch.size, "batch_tokens": batch.tokens},
        )

    def _collect(self) -> None:
        assert self._runner is not None
        running = self._running
        if running is None:
            return
        timeout_s = self.config.engine.engine_timeout_s
        for event in self._runner.drain():
            if isinstance(event, Finished) and event.batch_id == running.runner_id:
                for item in self.batcher.complete(event.completion.key):
                    result = completed(
                        item.payload,
                        event.completion,
                        identity=self.identity,
                        batch_size=running.batch.size,
                        dispatched_at=running.dispatched_at,
                        finished_at=event.finished_at,
                    )
                    job = item.payload
                    self._answer(
                        result, job.source, result.timings.queued_s, job.request.submitted_at
                    )
            elif isinstance(event, BatchDone) and event.batch_id == running.runner_id:
                self._batch_done(running, event)
        since = self._runner.running_since()
        if self._running is not None and since is not None and time.monotonic() - since > timeout_s:
            self._engine_hung(self._running, timeout_s)

    def _batch_done(self, running: _Running, event: BatchDone) -> None:
        batch = running.batch
        self.metrics.batch_done(
            size=batch.size,
            tokens=batch.tokens,
            fill_ratio=batch.tokens / self.config.batching.max_batch_tokens,
            padding_waste=batch.padding_waste,
            batch_wait_s=[running.dispatched_at - i.payload.admitted_at for i in batch.items],
            engine_s=event.engine_s,
        )
        for _ in range(event.out_of_memory):
            self.batcher.max_batch_size = self.adaptive.on_out_of_memory()
        self._running = None

    def _engine_hung(self, running: _Running, timeout_s: float) -> None:
        """The engine call outlived ``engine_timeout_s``: fail its requests, stop serving."""
        self._wedged = True
        self._running = None
        reason = f"engine call exceeded engine_timeout_s={timeout_s:g}"
        self.health.set_model_loaded(False, reason)
        log.error("%s; failing %d requests and going not ready", reason, running.batch.size)
        for item in running.batch.items:
            for answered in self.batcher.complete(item.key):
                self._fail(answered, ErrorCode.ENGINE_FAILED, reason)

    def _publish_and_commit(self, now: float) -> None:
        assert self._publisher is not None
        try:
            self._publisher.poll()
            self._publisher.maybe_commit(now)
        except TransactionAborted as exc:
            log.warning("%s; consuming those records again", exc)
            self._rewind(exc.partitions)
        else:
            self.metrics.set_inflight(len(self._open))

    def _adapt(self, now: float) -> None:
        """Resize batches from the engine's utilisation, sampled every adaptive interval.

        Only while there is work: an engine idle for want of requests says nothing about
        the batch size it can take, and shrinking then would only slow the next burst.
        """
        if now < self._next_adapt:
            return
        self._next_adapt = now + self.adaptive.interval_s
        utilization = min(1.0, max(0.0, self.engine.utilization()))  # over the whole interval
        self.metrics.set_utilization(utilization)
        if self.config.batching.adaptive and len(self.batcher):
            self.batcher.max_batch_size = self.adaptive.observe(utilization, now)
        self.metrics.set_adaptive_size(self.batcher.max_batch_size)

    def _flow(self) -> None:
        """Backpressure: pause every partition while ``prefetch_count`` requests are open."""
        full = not self.admission.has_room()
        if full != self._paused:
            self._pause(full)

    # -- answers -----------------------------------------------------------------------

    def _answer(
        self,
        result: InferenceResult,
        source: Source,
        queued_s: float = 0.0,
        submitted_at: float | None = None,
    ) -> None:
        assert self._publisher is not None
        with self.metrics.stage("encode"):
            value, headers = encode_result(result)

        def answered() -> None:
            if self._release(source):
                e2e = time.time() - submitted_at if submitted_at else None
                self.metrics.answered(
                    result.status,
                    result.error.code if result.error else None,
                    result.usage.prompt_tokens,
                    result.usage.completion_tokens,
                    result.usage.reasoning_tokens,
                    e2e,
                    queued_s,
                )

        with self.metrics.stage("produce"):
            self._publisher.send(
                self.config.kafka.results_topic,
                result.custom_id,
                value,
                headers,
                (source.topic, source.partition),
                answered,
            )

    def _dead_letter(self, letter: DeadLetter) -> None:
        assert self._publisher is not None
        log.warning(
            "dead-lettering %s: %d %s",
            letter.source.ref,
            letter.code,
            letter.message,
            extra={"code": int(letter.code)},
        )
        headers = [
            *letter.headers,
            ("error-code", str(int(letter.code)).encode()),
            ("error-message", letter.message.encode()),
            ("source", letter.source.ref.encode()),
        ]

        def answered() -> None:
            if self._release(letter.source):
                self.metrics.dead_lettered(letter.code)

        self._publisher.send(
            self.config.kafka.dead_letter_topic,
            letter.source.key,
            letter.value or b"",
            headers,
            (letter.source.topic, letter.source.partition),
            answered,
        )

    def _fail(self, item: Pending[Job], code: ErrorCode, message: str) -> None:
        job = item.payload
        request = job.request
        result = failed(request.custom_id, code, message, identity=self.identity, request=request)
        self._answer(result, job.source, submitted_at=request.submitted_at)

    def _release(self, source: Source) -> bool:
        """Mark a record answered, once; False when it was dropped meanwhile (revoked)."""
        if source.ref not in self._open:
            return False
        self._open.discard(source.ref)
        self.tracker.done((source.topic, source.partition), source.offset)
        self.admission.release()
        return True

    # -- rebalances --------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("assign")
        self.health.set_consumer_ok(True)
        log.info("assigned %s", _names(partitions))
        assert self._publisher is not None
        self._publisher.assign([(tp.topic, tp.partition) for tp in partitions])
        if self._paused:
            consumer.pause(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("revoke")
        log.info("revoked %s", _names(partitions))
        assert self._publisher is not None
        revoked = [(tp.topic, tp.partition) for tp in partitions]
        try:
            self._publisher.revoke(revoked)  # hand over what is answered
        except TransactionAborted:
            log.warning("commit on revoke aborted; the new owner answers those requests again")
        self._drop(revoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("lost")
        log.warning("lost %s", _names(partitions))
        assert self._publisher is not None
        lost = [(tp.topic, tp.partition) for tp in partitions]
        self._publisher.lost(lost)
        self._drop(lost)

    def _drop(self, partitions: Sequence[Partition]) -> None:
        """Forget in-flight requests of ``partitions``: their new owner answers them."""
        for item in self.batcher.drop_partitions(partitions):
            self._open.discard(item.key)
            self.admission.release()
        # records already answered but awaiting delivery: their offsets go with the partition
        gone = {f"{t}/{p}/" for t, p in partitions}
        stale = [ref for ref in self._open if ref.rsplit("/", 1)[0] + "/" in gone]
        for ref in stale:
            self._open.discard(ref)
            self.admission.release()
        self.tracker.forget(partitions)

    def _rewind(self, partitions: Sequence[Partition]) -> None:
        """After an abort: forget those partitions' work since their last commit, re-read it."""
        assert self._consumer is not None
        self._drop(partitions)
        rewind(self._consumer, partitions)

    def _pause(self, pause: bool) -> None:
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        if pause:
            self._consumer.pause(assignment)
        else:
            self._consumer.resume(assignment)
        self._paused = pause
        self.metrics.set_paused(len(assignment) if pause else 0)


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"


def run_worker(config: Config, engine: Engine | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the process exit code."""
    worker = Worker(config, engine)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: draining", signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return worker.run()
