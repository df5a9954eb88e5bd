"""The worker: poll → decode → admit → batch → run → publish → commit, until stopped.

One thread owns the consumer, the batcher and the offsets; the engine runs on its own
thread (:mod:`worker.loop.runner`) or its own scheduler (an in-flight engine), and under
exactly-once the commits run on the committer thread (:mod:`worker.kafka.committer`), so
the loop keeps polling, decoding and choosing what goes next while the engine computes
and a transaction commits. The stage
between them depends on how the engine is fed (:mod:`worker.loop.stage`). Every consumed
record is answered exactly once — a result, an error result or a dead letter — before its
offset can be committed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from batcher import (
    AdaptiveBatchSize,
    BatchLimits,
    DynamicBatcher,
    Partition,
    Pending,
)
from worker import __version__
from worker.config import Config
from worker.engines.base import Engine, InFlightEngine, StaticEngine
from worker.engines.factory import create_engine, resolve_kind
from worker.errors import ErrorCode, ModelLoadError
from worker.feeder.demand import DemandWriter
from worker.feeder.feeder import Feeder
from worker.feeder.headers import headers_of
from worker.kafka.cancellations import Cancellations
from worker.kafka.consumer import KafkaConsumer, Record
from worker.kafka.factory import ConfluentClients, KafkaClients
from worker.kafka.failures import GenerationLost
from worker.kafka.publisher import FatalKafkaError, Publisher, TransactionAborted
from worker.kafka.seals import sealed_by_control
from worker.loop.engine_stage import EngineStage
from worker.loop.gate import Gate
from worker.loop.held import HeldRecords
from worker.loop.inflight_stage import InFlightStage
from worker.loop.intake import DeadLetter, Intake, Outcome
from worker.loop.jobs import Identity, Job, Source
from worker.loop.ledger import Ledger
from worker.loop.outbox import Outbox
from worker.loop.stage import Stage, StageParts
from worker.obs.health import Health, MetricsServer
from worker.obs.lag import LagProbe
from worker.obs.logs import SummaryLogger
from worker.obs.metrics import WorkerMetrics
from worker.wire.codec import CodecLimits

log = logging.getLogger("batchpipe.worker")

EXIT_OK, EXIT_FATAL, EXIT_MODEL_LOAD, EXIT_WEDGED = 0, 1, 3, 4
_MAX_POLL_BATCH = 500
_PAUSE_AFTER_S = 0.5
#: after an engine batch that ran this long, what was read ahead is admitted before the next
#: batch forms (docs/architecture.md §2 "Backpressure"); shorter batches start at once
_ADMIT_FIRST_AFTER_S = _PAUSE_AFTER_S
#: with ``scheduling.fair``, how far a worker reads on past one engine batch, taking only
#: what librdkafka has fetched already (no wait), so that a newcomer's first slice fed
#: behind those records is seen (§2 "Backpressure"): records per ``prefetch_count`` slot,
#: and the held records' bytes in all (keys, values and headers)
_DEEP_PER_SLOT = 8
_DEEP_BYTES = 16 * 1024 * 1024
#: how long an assignment may wait for the group's committed offsets (inside the rebalance)
_ASSIGN_TIMEOUT_S = 30.0
_GIVEN_UP = (
    "publish_incomplete: its batch's publisher stopped before it sealed the batch (no "
    "seal on the control topic), so none of it is run (docs/architecture.md §7)"
)


class Worker:
    """One worker process's pipeline; ``clients`` default to confluent-kafka's."""

    def __init__(
        self, config: Config, engine: Engine | None = None, clients: KafkaClients | None = None
    ) -> None:
        if engine is None:
            # engine.kind auto becomes vllm or hf once, here, so that metrics, logs and the
            # demo name the engine that runs
            config = replace(config, engine=resolve_kind(config.engine))
        self.config = config
        self.clients = clients or ConfluentClients(config.kafka, config.limits)
        self.worker_id = config.worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.engine = engine or create_engine(config.engine, config.batching)
        self.identity = Identity(worker_id=self.worker_id, model=self.engine.model_name)
        b = config.batching
        self.metrics = WorkerMetrics(
            model=self.engine.model_name,
            engine=config.engine.kind,
            version=__version__,
            prefetch_limit=b.prefetch_count,
        )
        for collector in self.engine.collectors():
            self.metrics.registry.register(collector)
        self.health = Health(config.worker.liveness_timeout_s, metrics=self.metrics)
        self.server = MetricsServer(config.metrics, self.metrics, self.health)
        self.batcher: DynamicBatcher[Job] = DynamicBatcher(
            BatchLimits(
                max_batch_size=b.max_batch_size,
                max_batch_tokens=b.max_batch_tokens,
                timeout_s=b.timeout_ms / 1000.0,
                length_aware=b.length_aware,
                shared_prefix=b.shared_prefix,
                priority_aging_s=b.priority_aging_ms / 1000.0,
            ),
            dedup=b.dedup,
        )
        self.ledger = Ledger(b.prefetch_count)
        self.admission = self.ledger.admission
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
        self._next_adapt = 0.0
        self._paused = False
        #: records a full worker reads ahead into ``_held``: one engine batch (§2)
        self._ahead = b.max_batch_size
        #: records it reads on, without waiting, where the feeder tags newcomers (§2)
        self._deep = _DEEP_PER_SLOT * b.prefetch_count if config.scheduling.fair else 0
        self._held = HeldRecords(window=max(self._ahead, self._deep))
        self._full_since: float | None = None
        self._stop = threading.Event()
        self._summary = SummaryLogger(log)
        self._consumer: KafkaConsumer | None = None
        self._lag: LagProbe | None = None
        self._publisher: Publisher | None = None
        self._outbox: Outbox | None = None
        self._engine_stage: Stage | None = None
        self._stops: Cancellations | None = None
        #: requests published without fair share, held until their batch's seal (§7)
        self._gate = Gate()
        self._feeder: Feeder | None = None  # scheduling.fair: this worker's feeder role
        self._demand: DemandWriter | None = None  # scheduling.fair: what it can take (§10)
        self._read_to: dict[Partition, int] = {}  # the consumer's positions, as read

    @property
    def engine_stage(self) -> Stage:
        assert self._engine_stage is not None, "Kafka clients are not started"
        return self._engine_stage

    @property
    def lag(self) -> LagProbe:
        assert self._lag is not None, "Kafka clients are not started"
        return self._lag

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None, "Kafka clients are not started"
        return self._outbox

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
            if self.config.metrics.enabled:  # the lag is a metric: nothing reads it otherwise
                self.lag.start()
            if self.config.scheduling.fair:
                self._feeder = Feeder(self.config, self.metrics.registry)
                self._feeder.start()
                self._demand = DemandWriter(self.config.kafka, self.worker_id)
            return self._loop()
        except FatalKafkaError as exc:
            log.error("fatal Kafka error, exiting: %s", exc)
            return EXIT_FATAL
        finally:
            self._shutdown()

    def _start_kafka(self) -> None:
        k = self.config.kafka
        self.clients.ensure_topics([k.requests_topic, k.results_topic, k.dead_letter_topic])
        self._stops = Cancellations(
            self.clients.control(), lambda seal: self._gate.see(seal, time.monotonic())
        )
        self._consumer = self.clients.consumer()
        self._lag = LagProbe(
            self.clients.offsets(), self.metrics, self._unanswered, self._read_to.copy
        )
        self._publisher = self.clients.publisher(
            self._consumer, self.ledger.tracker, self.metrics.transaction
        )
        self._outbox = Outbox(k, self._publisher, self.ledger, self.metrics, self.identity)
        self.health.set_producer_ok(True)
        self._engine_stage = create_stage(
            self.engine,
            self.adaptive,
            StageParts(
                self.batcher, self.outbox, self.metrics, self.health, self.identity, self.config
            ),
        )
        self._subscribe()
        self.health.set_consumer_ok(True, "waiting for assignment")
        log.info(
            "worker %s serving %r from %s (delivery %s)",
            self.worker_id,
            self.engine.model_name,
            k.requests_topic,
            k.delivery,
        )

    def _subscribe(self) -> None:
        assert self._consumer is not None
        self._consumer.subscribe(
            [self.config.kafka.requests_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _loop(self) -> int:
        """Serve until stopped (drain, exit 0) or wedged (exit :data:`EXIT_WEDGED`).

        A wedged worker (its engine hung past ``engine_timeout_s``) can run nothing more,
        and its engine thread cannot be stopped: it leaves at once — the shutdown commits
        what is answered and leaves the group, so its partitions go to a healthy member —
        and exits non-zero, for the orchestrator to start a fresh process.
        """
        while not self._stop.is_set():
            self._step(draining=False)
            if self.engine_stage.wedged:
                log.error("worker wedged: leaving the group and exiting %d", EXIT_WEDGED)
                return EXIT_WEDGED
        self._drain()
        return EXIT_OK

    def _step(self, draining: bool) -> None:
        now = time.monotonic()
        self.health.beat()
        self._decode_admit(self._poll(draining), now)
        self._expire(now)
        self._cancel()
        self._unseal(now)
        self._collect(now, draining)
        self._adapt(now)
        self.engine_stage.dispatch(now, flush=draining)
        flex_closed = self.engine_stage.flex_closed
        self.admission.lent = self.batcher.flex_queued if flex_closed else 0
        self._publish_and_commit(now)
        self._flow(now, draining)
        if self._demand is not None:
            self._demand.step(
                now,
                self._consumer,
                self._read_to,
                self.admission,
                len(self._held),
                self._unanswered,
                flex=not flex_closed,
            )
        self._summary.maybe_log(now, self.metrics.snapshot)
        self.outbox.add_stages()
        self.metrics.flush()  # what this step's answers and stages added, once

    def _drain(self) -> None:
        """Stop taking records; finish what is in flight up to ``drain_timeout_s``."""
        assert self._consumer is not None
        self._pause(True)
        deadline = time.monotonic() + self.config.worker.drain_timeout_s
        while self.ledger and time.monotonic() < deadline and not self.engine_stage.wedged:
            self._step(draining=True)
        if self.ledger:
            log.warning("drain timed out with %d requests unanswered", len(self.ledger))

    def _shutdown(self) -> None:
        # after a fatal Kafka error every commit fails again: the worker still leaves cleanly
        if self._feeder is not None:
            self._feeder.stop()  # first: it hands the pending partition to another worker
        if self._lag is not None:
            self._lag.stop()  # its queries use the consumer
        if self._consumer is not None:
            try:
                if self._publisher is not None:
                    self._publisher.commit()
            except (TransactionAborted, FatalKafkaError, GenerationLost) as exc:
                log.warning("final commit failed: %s", exc)
            try:
                self._consumer.close()  # leaves the group now, not after session.timeout.ms
            except (TransactionAborted, FatalKafkaError, GenerationLost) as exc:
                log.warning("commit on leaving the group failed: %s", exc)
        if self._publisher is not None:
            try:
                self._publisher.close()
            except (TransactionAborted, FatalKafkaError, GenerationLost) as exc:
                log.warning("closing the publisher failed: %s", exc)
        if self._stops is not None:
            self._stops.close()
        if self._engine_stage is not None:
            self._engine_stage.stop()
        self.engine.close()
        if self._outbox is not None:
            self._outbox.add_stages()
        self.metrics.flush()  # answers the final commit or delivery counted
        self.server.stop()

    # -- the verbs ---------------------------------------------------------------------

    def _collect(self, now: float, draining: bool) -> None:
        """Answer what finished; when that ended a long engine batch, admit what was read
        ahead before the next batch forms.

        A newcomer's records, fed while the batch ran and tagged lower than what the worker
        queued (§10), then run in the batch formed now instead of one engine batch later.
        Nothing waits for the broker (what is held, then what librdkafka already fetched):
        the engine's next batch starts later only by the decoding of at most the freed
        slots' records, and only after a batch that ran :data:`_ADMIT_FIRST_AFTER_S` or
        longer, so a fast engine starts its next batch at once as before.
        """
        stage = self.engine_stage
        was_busy = stage.busy
        stage.collect()
        if draining or not was_busy or stage.busy or stage.last_run_s < _ADMIT_FIRST_AFTER_S:
            return
        self._decode_admit(self._poll(draining, wait=False), now)

    def _poll(self, draining: bool, wait: bool = True) -> list[Record]:
        """Records to admit now, never more than the room: everything read goes through
        :mod:`worker.loop.held`, which hands them over in read order but newcomers first.

        Full, the worker reads on, up to one engine batch ahead
        (``batching.max_batch_size``), so that a record fed while the engine runs is at hand
        when it frees slots (:meth:`_collect`); with ``scheduling.fair``, further, as far as
        librdkafka has fetched already (:data:`_DEEP_PER_SLOT`, :data:`_DEEP_BYTES`), so
        that a newcomer's first slice is not read after everything fetched before it (a
        fast worker's topic holds half a second of its reads, §10). With no room and that
        much held, or draining, ``poll()`` still runs while the partitions are paused: it
        serves rebalances and callbacks. A record it returns anyway is held, never dropped.
        ``wait=False``: only what is held or fetched already.

        The consumer is called before anything is taken from the held records: a revoke it
        serves lets go of its partitions' held records first. Taken before the call, they
        were admitted for a partition revoked meanwhile, and answered again by its new owner.
        """
        assert self._consumer is not None
        room = 0 if draining or not self._has_room() else min(self.admission.room, _MAX_POLL_BATCH)
        if (room and len(self._held)) or not wait:
            timeout = 0.0
        elif self.engine_stage.busy or self.engine_stage.holding_back:
            timeout = 0.005  # notice finished requests (or the engine taking flex) quickly
        else:
            wake = self.batcher.wake_at()
            timeout = 0.1 if wake is None else min(0.1, max(0.0, wake - time.monotonic()))
        # what the room needs beyond the held records; with none, what reads ahead: asked
        # for more than the room, ``consume`` would wait its whole timeout for them
        short = room - len(self._held)
        want = short if short > 0 else self._ahead + short
        if self._paused:
            polled = self._consumer.poll(timeout)
            self._held.hold(_checked([] if polled is None else [polled], self._read_to))
            return self._held.take(room)
        more = True  # whether librdkafka may have fetched more than was read
        if want > 0:
            read = self._consumer.consume(want, timeout=timeout)
            self._held.hold(_checked(read, self._read_to))
            more = len(read) == want
        elif not room and wait:
            time.sleep(min(timeout, 0.002))  # full for a moment: let the engine free room
        # read what is fetched already, so that the held records are taken newcomers first
        # (worker.loop.held), not in the order librdkafka fetched them; an engine batch's worth
        # at a time, so that the bytes bound is passed by one such read at most
        while more and self._held.bytes < _DEEP_BYTES and len(self._held) < self._deep:
            ask = min(self._deep - len(self._held), self._ahead)
            read = self._consumer.consume(ask, 0.0)
            self._held.hold(_checked(read, self._read_to))
            more = len(read) == ask
        return self._held.take(room)

    def _decode_admit(self, records: list[Record], now: float) -> None:
        """Open, decode and admit each record; the decode stage's time is added once for
        the whole poll (one counter update, not one per record)."""
        decoding, skipped = 0.0, 0
        for message in records:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            _, timestamp_ms = message.timestamp()
            key = message.key()
            source = Source(
                topic,
                partition,
                offset,
                key if isinstance(key, bytes) else None,
                timestamp_ms / 1000.0 if timestamp_ms > 0 else None,
                generation=self.ledger.generation,
            )
            if not self.ledger.open(source):
                skipped += 1  # answered by an earlier owner of its partition (§2)
                continue
            start = time.perf_counter()
            # headers the client cannot read (a name that is not UTF-8): none, as the
            # feeder reads them
            headers = headers_of(message)
            outcome = self.intake.take(source, message.value(), headers, now)
            decoding += time.perf_counter() - start
            if isinstance(outcome, Pending) and sealed_by_control(headers):
                self._gated(outcome, now)
            else:
                self._route(outcome, source, now)
        if records:
            self.metrics.add_stage("decode", decoding)
        if skipped:
            self.metrics.answered_before(skipped)

    def _route(self, outcome: Outcome, source: Source, now: float) -> None:
        """A job to the batcher (or its batch's stop answer), or the answer it already is."""
        if isinstance(outcome, Pending):
            assert self._stops is not None
            stop = self._stops.stop_for(outcome.payload.request.batch_id)
            if stop is not None:
                self.outbox.failure(outcome.payload, stop.code, stop.message)
            elif self.batcher.add(outcome, now):
                self.metrics.dedup_hit()
        elif isinstance(outcome, DeadLetter):
            self.outbox.dead_letter(outcome)
        else:
            self.outbox.result(outcome.result, source, submitted_at=outcome.submitted_at)

    def _gated(self, pending: Pending[Job], now: float) -> None:
        """A request published without fair share: on to the batcher once its batch is
        sealed, held until then, answered 4009 once it is given up (:mod:`worker.loop.gate`)."""
        verdict = self._gate.verdict(pending.payload.request.batch_id)
        if verdict == "hold":
            self._gate.hold(pending, now)
        elif verdict == "void":
            self.outbox.failure(pending.payload, ErrorCode.PUBLISH_INCOMPLETE, _GIVEN_UP)
        else:
            self._route(pending, pending.payload.source, now)

    def _unseal(self, now: float) -> None:
        """Requests whose batch was sealed or given up since the last step."""
        released, given_up = self._gate.step(now)
        for pending in released:
            self._route(pending, pending.payload.source, now)
        for pending in given_up:
            self.outbox.failure(pending.payload, ErrorCode.PUBLISH_INCOMPLETE, _GIVEN_UP)
        if given_up:
            log.warning("gave up %d requests of batches whose publish did not end", len(given_up))

    def _expire(self, now: float) -> None:
        for item in self.batcher.pop_expired(now):
            self.outbox.failure(
                item.payload, ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request ran"
            )

    def _cancel(self) -> None:
        """Answer the requests of batches stopped since the last step (4005/4006) without
        running them: queued ones, and those an in-flight engine aborts; a static batch
        already on the engine finishes and keeps its results."""
        assert self._stops is not None
        stopped = self._stops.poll()
        if not stopped:
            return
        doomed = self.engine_stage.cancel(lambda p: p.payload.request.batch_id in stopped)
        for item in doomed:
            stop = stopped[item.payload.request.batch_id]
            self.outbox.failure(item.payload, stop.code, stop.message)
        log.info("stopped %d batches: %d unfinished requests answered", len(stopped), len(doomed))

    def _publish_and_commit(self, now: float) -> None:
        assert self._publisher is not None
        try:
            self._publisher.poll()
            idle = not self.engine_stage.busy
            self._publisher.maybe_commit(now, idle)
        except TransactionAborted as exc:
            log.warning("%s; consuming those records again", exc)
            self._rewind(exc.partitions)
        except GenerationLost as exc:
            self._rejoin(exc)
        else:
            self.metrics.set_inflight(len(self.ledger))

    def _adapt(self, now: float) -> None:
        """Resize batches from the engine's utilisation, sampled every adaptive interval,
        before the next batch forms.

        Only while there is work: an engine idle for want of requests says nothing about
        the batch size it can take, and shrinking then would only slow the next burst. And
        at every step, after any sample, more requests waiting than the size undo a
        trickle's shrinks (:meth:`AdaptiveBatchSize.backlog`): a burst's first batch is a
        whole one, and a shrink never cuts the batch about to form.
        """
        adaptive = self.config.batching.adaptive
        queued = len(self.batcher)
        sampled = now >= self._next_adapt
        if sampled:
            self._next_adapt = now + self.adaptive.interval_s
            utilization = min(1.0, max(0.0, self.engine.utilization()))  # the whole interval
            self.metrics.set_utilization(utilization)
            if adaptive and queued:
                self.adaptive.observe(utilization, now, queued)
        size = self.adaptive.backlog(queued) if adaptive else self.batcher.max_batch_size
        if sampled or size != self.batcher.max_batch_size:
            self.batcher.max_batch_size = size
            self.metrics.set_adaptive_size(size)

    def _flow(self, now: float, draining: bool) -> None:
        """Backpressure: no new records while ``prefetch_count`` requests are open.

        A full worker reads on, one engine batch ahead (:meth:`_poll`). Pausing the
        partitions (so that polling, which serves rebalances and callbacks, returns no
        records) waits until it has been full and held that much for ``_PAUSE_AFTER_S``
        (a batch that ends frees room and takes from what is held, so the clock restarts):
        librdkafka drops a paused partition's prefetched records and fetches them again on
        resume, a broker round trip per pause that a fast engine, full for milliseconds at a
        time, would pay on every batch. A draining worker stays paused, so that it keeps
        polling: rebalances are served until it exits.
        """
        if draining:
            return
        if self._has_room() or len(self._held) < self._ahead:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now
        pause = self._full_since is not None and now - self._full_since >= _PAUSE_AFTER_S
        if pause != self._paused:
            self._pause(pause)

    # -- rebalances --------------------------------------------------------------------

    def _on_assign(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("assign")
        self.health.set_consumer_ok(True)
        log.info("assigned %s", _names(partitions))
        assert self._publisher is not None
        assigned = [(tp.topic, tp.partition) for tp in partitions]
        try:
            self._publisher.assign(assigned)
        except GenerationLost as exc:  # committing under the old id: that generation is over
            log.warning("the last commit before this assignment was refused (%s)", exc)
            self._publisher.assign(assigned)  # a new producer, for this generation
        self.lag.gained(assigned)
        try:
            # a partition the group never committed starts at FROM_START, not where the
            # broker says its earliest offset is (see FROM_START: a broker can say wrong);
            # what earlier owners answered above it is skipped (§2 "Answers on completion")
            consumer.assign(self._publisher.resume(assigned, _ASSIGN_TIMEOUT_S))
        except KafkaException as exc:
            log.warning("committed offsets unreadable (%s); assigning from the defaults", exc)
        if self._paused:
            consumer.pause(partitions)
        else:
            consumer.resume(partitions)  # librdkafka keeps a pause across unassign and assign

    def _on_revoke(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("revoke")
        log.info("revoked %s", _names(partitions))
        assert self._publisher is not None
        revoked = [(tp.topic, tp.partition) for tp in partitions]
        try:
            self._publisher.revoke(revoked)  # hand over what is answered
        except TransactionAborted:
            log.warning("commit on revoke aborted; the new owner answers those requests again")
        except GenerationLost as exc:  # the group is rebalancing: it assigns anew anyway
            log.warning("commit on revoke refused, generation lost (%s); dropped", exc)
        self.lag.released(revoked)
        self._drop(revoked)

    def _on_lost(self, consumer: KafkaConsumer, partitions: list[TopicPartition]) -> None:
        self.metrics.rebalance("lost")
        log.warning("lost %s", _names(partitions))
        assert self._publisher is not None
        lost = [(tp.topic, tp.partition) for tp in partitions]
        self._publisher.lost(lost)
        self.lag.released(lost)
        self._drop(lost)

    def _drop(self, partitions: Sequence[Partition]) -> None:
        """Forget in-flight requests of ``partitions``: their new owner answers them.

        What of them is on an in-flight engine is aborted there first.
        """
        self.engine_stage.drop(partitions)
        self.batcher.drop_partitions(partitions)
        self.ledger.forget(partitions)
        self._held.release(partitions)
        self._gate.drop(partitions)
        self.outbox.forget(partitions)
        for partition in partitions:  # read again from the committed offset, or not here
            self._read_to.pop(partition, None)

    def _rejoin(self, cause: GenerationLost) -> None:
        """This worker's generation of the group is over (fenced, or its commit refused by
        generation): the publisher has dropped its producer and every answer it held. Forget
        every partition and, unless the consumer lost them already (it then rejoins by
        itself), leave the group and join again. The engine and its model stay loaded; the
        next assignment builds a new producer (docs/architecture.md §2)."""
        assert self._consumer is not None
        self.metrics.rebalance("lost")
        owned = [(tp.topic, tp.partition) for tp in self._consumer.assignment()]
        log.warning("generation lost (%s): rejoining the group without %s", cause, owned)
        self.lag.released(owned)
        self._drop(owned)
        if owned:
            self._consumer.unsubscribe()
            self._subscribe()

    def _has_room(self) -> bool:
        """Room for a new record: a free ``prefetch_count`` slot, and answers waiting for
        their commit below their bounds (``kafka.max_buffered_*``)."""
        assert self._publisher is not None
        return self.admission.has_room() and not self._publisher.full()

    def _unanswered(self, partition: Partition) -> int:
        """Records of ``partition`` read and not answered yet: in flight or held."""
        return self.ledger.tracker.pending(partition) + self._held.count(partition)

    def _rewind(self, partitions: Sequence[Partition]) -> None:
        """After an abort: forget those partitions' work since their last commit, re-read it."""
        assert self._publisher is not None
        self._drop(partitions)
        self._publisher.rewind(partitions)

    def _pause(self, pause: bool) -> None:
        assert self._consumer is not None
        assignment = self._consumer.assignment()
        if pause:
            self._consumer.pause(assignment)
        else:
            self._consumer.resume(assignment)
        self._paused = pause
        self.metrics.set_paused(len(assignment) if pause else 0)


def create_stage(engine: Engine, adaptive: AdaptiveBatchSize, parts: StageParts) -> Stage:
    """The stage for ``engine``'s feeding mode (:attr:`Engine.mode`); ``adaptive`` shrinks
    static batches that ran out of memory."""
    if isinstance(engine, StaticEngine):
        return EngineStage(engine, adaptive, parts)
    if isinstance(engine, InFlightEngine):
        return InFlightStage(engine, parts)
    raise TypeError(f"engine {type(engine).__name__} is neither static nor in flight")


def _checked(messages: Sequence[Record], read_to: dict[Partition, int]) -> list[Record]:
    """The records among ``messages``; a fatal consumer error raises, others are logged.

    ``read_to`` notes, per partition, the offset after the last record read: the
    consumer's position, which the lag probe may not ask the consumer for
    (:mod:`worker.obs.lag`)."""
    good = []
    for m in messages:
        error = m.error()
        if error is None:
            good.append(m)
            read_to[(m.topic(), m.partition())] = m.offset() + 1  # type: ignore[index,operator]
        elif error.code() != KafkaError._PARTITION_EOF:
            if error.fatal():
                raise FatalKafkaError(f"consumer: {error}")
            log.warning("consumer error: %s", error)
    return good


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
