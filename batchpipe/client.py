"""The Python client: submit a batch, watch it, collect its results.

``Client`` is the one code path behind the ``batchpipe submit``, ``status`` and
``collect`` commands, configured exactly as the worker is (:mod:`worker.config`).

    client = Client(bootstrap="127.0.0.1:9092")
    receipt = client.submit_file("batch.jsonl")
    client.collect(receipt.batch_id, "output.jsonl", "errors.jsonl", timeout_s=600)
    print(client.status(receipt.batch_id).completed)

A batch is published whole — all of its requests or none — after every request passed
validation (:mod:`batchpipe.batchfile`), each request to its model's requests topic
(``kafka.routes``, :mod:`worker.routing`): with fair share to its pending topic without a
transaction, then its end marker (the feeder runs it only then), else in one Kafka
transaction (docs/architecture.md §10 "Publish without transactions", §7). Results are read with
``read_committed`` consumers that start at the batch's submit time (see
:mod:`batchpipe.collect`) and never join a group or commit offsets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
)
from msgspec import structs

from batcher.tiers import DEFAULT, check_allowance
from batchpipe.batchfile import (
    DEFAULT_LIMITS,
    FileLimits,
    iter_file,
    scan_file,
    validate_requests,
)
from batchpipe.caps import Cap, CapError, CapWatch, given_cap
from batchpipe.collect import (
    BatchStatus,
    BatchTally,
    batch_results,
    batch_time,
    new_batch_id,
    open_reader,
    record_headers,
    records,
    write_result,
)
from batchpipe.deliveries import Deliveries
from batchpipe.direct import publish_direct
from batchpipe.paced import paced
from batchpipe.progress import Progress
from worker.config import Config, load_config, producer_max_bytes
from worker.errors import BatchpipeError, RequestError
from worker.feeder.estimate import request_tokens
from worker.feeder.headers import MAX_ID_CHARS, scheduled_as, tier_in
from worker.feeder.naming import (
    ALIVE_S,
    HOLD_S,
    alive_marker,
    check_tier,
    check_weight,
    end_marker,
    ensure_pending,
    pending_headers,
    pending_topic,
    tokens_header,
)
from worker.kafka import clients
from worker.kafka.cancellations import Announcer
from worker.kafka.produce import produce
from worker.kafka.seals import GIVE_UP_S, Seal, sealed_by_control
from worker.routing import RoutingTable
from worker.wire.codec import CodecLimits, decode_request, encode_request
from worker.wire.messages import InferenceRequest, InferenceResult

__all__ = [
    "DEFAULT_COMPLETION_WINDOW_S",
    "BatchNotFoundError",
    "BatchStatus",
    "Client",
    "CollectTimeoutError",
    "FileLimits",
    "PublishIncompleteError",
    "SubmitReceipt",
]

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_WINDOW_S = 24 * 3600.0
#: with fair share the lines are read on a thread (:func:`~batchpipe.paced.paced`), and
#: when none came for this long the publisher looks whether a heartbeat is due
CHUNK_S = 0.5
#: with fair share, a record not acknowledged this long after it was produced fails the
#: publish (librdkafka's ``message.timeout.ms``): well inside ``HOLD_S``, so a record the
#: broker took late never lands after the feeder has given its batch up
DELIVERY_TIMEOUT_S = 30.0

TextTarget = str | os.PathLike[str] | TextIO


class _Stamp:
    """One batch's stamping and routing of its requests."""

    def __init__(
        self,
        batch_id: str,
        total: int,
        submitted_at: float,
        routes: Mapping[str, str],
        route: Callable[[str], str],
    ) -> None:
        self.batch_id, self.total, self.submitted_at = batch_id, total, submitted_at
        self.routes, self._route = routes, route

    def encoded(self, req: InferenceRequest) -> tuple[str, bytes, list[tuple[str, bytes]]]:
        """``req`` stamped with its batch: its requests topic, value and headers."""
        # a model not scanned (the file changed since): routed, or refused, now
        topic = self.routes.get(req.model) or self._route(req.model)
        stamped = structs.replace(
            req, batch_id=self.batch_id, batch_total=self.total, submitted_at=self.submitted_at
        )
        value, headers = encode_request(stamped)
        return topic, value, list(headers)


def _flush(producer: Producer, deliveries: Deliveries) -> None:
    """Wait for every delivery; ``KafkaException`` if one failed or some never came."""
    deliveries.check(producer.flush(DELIVERY_TIMEOUT_S + 5))


def check_name(text: str, what: str) -> str:
    """``text`` if it can be a batch id or key: the feeder keeps at most
    :data:`~worker.feeder.headers.MAX_ID_CHARS` characters (a longer one would lose the
    batch its schedule, in silence) and ``list`` shows it as written, so no control
    character. ``ValueError`` naming ``what`` otherwise."""
    if len(text) > MAX_ID_CHARS:
        raise ValueError(f"{what}: at most {MAX_ID_CHARS} characters, got {len(text)}")
    if not text.isprintable():
        raise ValueError(f"{what}: {text[:40]!r} holds a character that is not printable")
    return text


@dataclass(frozen=True)
class SubmitReceipt:
    """A published batch: its id, number of requests and submit time (unix seconds)."""

    batch_id: str
    total: int
    submitted_at: float


class CollectTimeoutError(BatchpipeError, TimeoutError):
    """The batch was not complete when the timeout ran out; ``status`` says how far it got."""

    def __init__(self, status: BatchStatus, timeout_s: float) -> None:
        super().__init__(
            f"batch {status.batch_id}: {status.completed + status.failed} of "
            f"{status.total or '?'} requests answered after {timeout_s:g}s"
        )
        self.status = status
        self.timeout_s = timeout_s


class BatchNotFoundError(BatchpipeError, LookupError):
    """Neither a request nor a result of the batch is on its topics."""


class PublishIncompleteError(BatchpipeError, RuntimeError):
    """The batch's publisher stopped before it ended the batch: none of it is run."""


#: how often ``collect`` looks again for a batch published but not visible yet
LOOK_AGAIN_S = 1.0
NOT_VISIBLE = (
    "published, not visible yet: its publisher's transaction has not committed "
    "(a publisher still writing it, or one killed mid-publish until the broker ends it)"
)
PUBLISHING = "being published: its end marker is not written yet"
#: without fair share: its requests are readable, held by the workers until its seal
SEALING = "being published: its seal is not written yet"
VOID = (
    "publish incomplete: its publisher stopped before it sealed the batch, and the workers "
    "answered what they read of it 4009 publish_incomplete without running it"
)


@dataclass
class Sighting:
    """What the requests and pending topics hold of one batch (:meth:`Client.sighting`)."""

    #: its first request readable read_committed; None when there is none
    request: InferenceRequest | None = None
    #: a request of it was read only read_uncommitted: in a transaction not committed
    hidden: bool = False
    #: found on a pending topic, published to end with an end marker
    sealed: bool = False
    ended: bool = False  # that end marker was read
    #: the newest of its records and heartbeats on a pending topic (unix seconds)
    last_at: float | None = None
    #: published without fair share: its requests wait for a seal (worker.kafka.seals)
    gated: bool = False
    #: that batch's newest seal on the control topic, None when there is none
    seal: Seal | None = None
    #: the service tier its first request asks for (None: no request read)
    tier: str | None = None

    def interrupted(self, now: float) -> bool:
        """Its publisher stopped before the end marker: nothing of it for ``HOLD_S``; or,
        without fair share, before its seal: void, or no sign for ``GIVE_UP_S``."""
        if self.gated:
            seal = self.seal
            return seal is not None and (
                seal.state == "void" or (seal.state == "open" and now - seal.at > GIVE_UP_S)
            )
        return (
            self.sealed
            and not self.ended
            and self.last_at is not None
            and now - self.last_at > HOLD_S
        )

    def detail(self, now: float) -> str | None:
        if self.interrupted(now):
            if self.gated:
                return VOID
            return (
                f"publish incomplete: no end marker and nothing of it for {HOLD_S:.0f} s "
                "(its publisher stopped); none of it is run"
            )
        if self.gated and (self.seal is None or self.seal.state == "open"):
            return SEALING
        if self.request is None and self.hidden:
            return NOT_VISIBLE
        if self.sealed and not self.ended:
            return PUBLISHING
        return None


class Client:
    """Submits batches and reads their results.

    ``config`` defaults to :func:`worker.config.load_config` (defaults overridden by
    ``BATCHPIPE_*`` environment variables); ``bootstrap`` overrides
    ``kafka.bootstrap_servers``; ``limits`` are checked before anything is published.
    ``kafka.routes`` sends each request to its model's requests topic (:attr:`routing`);
    an invalid table raises :class:`~worker.routing.RoutesError`.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        bootstrap: str | None = None,
        limits: FileLimits = DEFAULT_LIMITS,
    ) -> None:
        config = config if config is not None else load_config()
        if bootstrap:
            config = replace(config, kafka=replace(config.kafka, bootstrap_servers=bootstrap))
        self.config = config
        self.limits = limits
        self.routing = RoutingTable.from_kafka(config.kafka)
        self._codec_limits = CodecLimits.from_config(config.limits)

    @property
    def codec_limits(self) -> CodecLimits:
        """The limits records are decoded under (``limits``)."""
        return self._codec_limits

    # -- submit ---------------------------------------------------------------------

    def submit(
        self,
        requests: Iterable[InferenceRequest | Mapping[str, Any]],
        batch_id: str | None = None,
        *,
        weight: float | None = None,
        key: str = "",
        tier: str = DEFAULT,
    ) -> SubmitReceipt:
        """Validate and publish requests (dataclasses or OpenAI/Bailian batch-line dicts).

        Raises :class:`~batchpipe.batchfile.BatchFileError` (nothing published) when any
        request is invalid, :class:`~worker.routing.UnroutedModelError` (nothing published)
        when routes are configured and a request's model has none, ``KafkaException`` when
        publishing fails (nothing of the batch is run: with fair share the feeder holds it
        until its end marker, written last once every record was acknowledged).

        With ``scheduling.fair`` the batch goes to the pending topic, and the feeder moves
        it on by fair share (docs/architecture.md §10): ``key`` names whose share it takes
        (the publisher's: a key's batches together get one key's share), ``weight``
        (default ``scheduling.weight``) is its share against other keys and within its
        key against its other batches; ``ValueError`` when it is not in [0.001, 1000],
        or when ``batch_id`` or ``key`` fails :func:`check_name`. ``tier`` is its service
        tier: ``"priority"`` (fed ahead of the default tier within the key's allowance,
        ``scheduling.priority_shares``), ``"default"`` or ``"flex"`` (fed only from
        capacity no other batch wants); ``ValueError`` for any other, or for a tier other
        than ``"default"`` without ``scheduling.fair`` (a FIFO has no tiers);
        :class:`~batcher.tiers.TierRefusedError` (nothing published) for ``"priority"``
        when this client's ``scheduling.priority_shares`` gives ``key`` an allowance of 0
        (the feeder's configuration decides the rest: docs/api.md "Service tiers").
        """
        checked = validate_requests(requests, self.limits)
        models = {r.model for r in checked}
        return self._publish(checked, len(checked), batch_id, models, weight, key, tier)

    def submit_file(
        self,
        path: str | os.PathLike[str],
        batch_id: str | None = None,
        *,
        weight: float | None = None,
        key: str = "",
        tier: str = DEFAULT,
    ) -> SubmitReceipt:
        """Validate and publish a JSONL batch file; see :meth:`submit`.

        The file is streamed twice (validate, then publish), never held in memory.
        """
        scan = scan_file(path, self.limits)
        requests = iter_file(path, self.limits)
        return self._publish(requests, scan.total, batch_id, scan.models, weight, key, tier)

    def run(
        self,
        path: str | os.PathLike[str],
        output: TextTarget,
        errors: TextTarget,
        timeout_s: float | None = None,
        *,
        batch_id: str | None = None,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        progress: Progress | None = None,
        tier: str = DEFAULT,
    ) -> BatchStatus:
        """:meth:`submit_file`, then :meth:`collect` until every line is answered, as
        ``batchpipe run``: under ``max_tokens``/``max_cost_usd`` (see :meth:`collect`;
        a cost cap needs a file of one model with a price), read before anything is
        published, so a bad cap publishes nothing; ``tier`` as :meth:`submit`."""
        scan = scan_file(path, self.limits)
        model = next(iter(scan.models)) if len(scan.models) == 1 else None
        given_cap(max_tokens, max_cost_usd, model, self.config.api.prices)
        receipt = self._publish(
            iter_file(path, self.limits), scan.total, batch_id, scan.models, None, "", tier
        )
        return self.collect(
            receipt.batch_id,
            output,
            errors,
            timeout_s,
            since=receipt.submitted_at,
            progress=progress,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
            model=model,
        )

    def publish_file(
        self,
        path: str | os.PathLike[str],
        total: int,
        batch_id: str | None,
        models: Collection[str],
        *,
        weight: float | None = None,
        key: str = "",
        tier: str = DEFAULT,
    ) -> SubmitReceipt:
        """Publish a file that :func:`~batchpipe.batchfile.scan_file` already accepted
        (the API server validates each file once, at upload, and the CLI before it asks
        the broker), naming ``models``; ``batch_id`` None makes a new one; see :meth:`submit`.

        Publishing again with the same ``batch_id`` duplicates nothing that readers count:
        results are kept once per ``custom_id`` (an earlier attempt cut short is never run
        alone: it has no end marker, or its transaction is fenced by the same id).
        """
        requests = iter_file(path, self.limits)
        return self._publish(requests, total, batch_id, models, weight, key, tier)

    def _publish(
        self,
        requests: Iterable[InferenceRequest],
        total: int,
        batch_id: str | None,
        models: Collection[str],
        weight: float | None,
        key: str,
        tier: str = DEFAULT,
    ) -> SubmitReceipt:
        kafka, fair = self.config.kafka, self.config.scheduling.fair
        check_name(batch_id or "", "batch_id")
        check_name(key, "key")
        share = check_weight(self.config.scheduling.weight if weight is None else weight)
        if check_tier(tier) != DEFAULT and not fair:
            raise ValueError(
                f"tier {tier!r}: applies with scheduling.fair only (a FIFO has no tiers)"
            )
        check_allowance(tier, self.config.scheduling.priority_shares, key, "tier")
        # every model is routed before anything is produced: a refused batch leaves no
        # record at all (aborted records still reach readers on some brokers, §7)
        routes = {model: self.routing.topic_for(model) for model in models}
        submitted_at = time.time()
        batch_id = batch_id or new_batch_id(submitted_at)
        max_bytes = producer_max_bytes(kafka, self.config.limits)
        topics = [*sorted(set(routes.values())), kafka.results_topic, kafka.dead_letter_topic]
        clients.ensure_topics(kafka, topics, max_message_bytes=max_bytes)
        if fair:
            ensure_pending(kafka, self.config.limits, sorted(set(routes.values())))
        scheduling = pending_headers(batch_id, share, key, sealed=True, tier=tier) if fair else []
        extra: dict[str, Any] = {
            "message.max.bytes": max_bytes,
            # one producer a batch: with sparse connections librdkafka connects to a
            # broker only once it needs one, 50 ms apart, and init_transactions then
            # raced the transaction coordinator's connection and now and then waited
            # 0.5 s on a timer (2-3 % alone, a third of serve's publishes beside a
            # large one's); connecting to every broker at once, it took 3 ms (was 54)
            "enable.sparse.connections": False,
        }
        stamp = _Stamp(batch_id, total, submitted_at, routes, self.routing.topic_for)
        if fair:
            self._publish_pending(stamp, requests, scheduling, share, key, extra)
        else:
            self._publish_direct(stamp, requests, extra)
        return SubmitReceipt(batch_id, total, submitted_at)

    def _publish_pending(
        self,
        stamp: _Stamp,
        requests: Iterable[InferenceRequest],
        scheduling: list[tuple[str, bytes]],
        share: float,
        key: str,
        extra: dict[str, Any],
    ) -> None:
        """Fair share: every record to the pending topic without a transaction (an
        idempotent producer: in order, none twice), the end marker with their count last
        (docs/architecture.md §10, "Publish without transactions, feed on the end marker").
        Nothing here can hide another batch: no transaction holds the pending partition's
        last stable offset. A heartbeat goes out whenever no line came for
        :data:`ALIVE_S`, so the feeder tells a slow publisher from a dead one."""
        kafka, max_tokens = self.config.kafka, self.config.generation.max_tokens
        deliveries = Deliveries()
        producer = clients.producer(
            kafka,
            extra={
                **extra,
                "message.timeout.ms": int(DELIVERY_TIMEOUT_S * 1000),
                "on_delivery": deliveries.report,
                "delivery.report.only.error": True,
            },
        )

        counts: Counter[str] = Counter()
        topics = sorted({pending_topic(t) for t in stamp.routes.values()})
        last = time.monotonic()
        try:
            for req in paced(requests, CHUNK_S):
                deliveries.check()
                if req is None:  # no line for CHUNK_S: the store is slow, not the publisher dead
                    if time.monotonic() - last >= ALIVE_S:
                        for topic in topics:
                            produce(producer, topic, None, None, alive_marker(stamp.batch_id))
                        last = time.monotonic()
                    continue
                topic, value, headers = stamp.encoded(req)
                tokens = tokens_header(request_tokens(req, max_tokens))
                topic = pending_topic(topic)
                headers = [*headers, *scheduling, tokens]
                produce(producer, topic, req.custom_id.encode(), value, headers)
                counts[topic] += 1
                last = time.monotonic()
            # every record acknowledged before the marker says they are all there: a
            # record that failed is never covered by a marker (the feeder also counts)
            _flush(producer, deliveries)
            for topic, count in counts.items():
                marker = end_marker(stamp.batch_id, share, key, count)
                produce(producer, topic, None, None, marker)
            _flush(producer, deliveries)
        except BaseException:
            clients.forget_topics(kafka.bootstrap_servers)  # a topic may be gone: ask again
            raise

    def _publish_direct(
        self, stamp: _Stamp, requests: Iterable[InferenceRequest], extra: dict[str, Any]
    ) -> None:
        """``scheduling.fair: false``: straight to the requests topic without a transaction,
        sealed on the control topic (:mod:`batchpipe.direct`, docs/architecture.md §7)."""
        publish_direct(self.config.kafka, stamp.batch_id, requests, stamp.encoded, extra)

    # -- read back ------------------------------------------------------------------

    def results(
        self,
        batch_id: str,
        timeout_s: float | None = None,
        *,
        since: float | None = None,
        partial: bool = False,
    ) -> Iterator[InferenceResult]:
        """Yield each request's result once, in arrival order, until the batch is complete
        — or, with ``partial``, the results answered now (the results topic read to its
        end), and stop there whether the batch is complete or not.

        Raises :class:`CollectTimeoutError` when ``timeout_s`` passes first. ``since``
        (unix seconds) is where reading starts; by default the time inside a generated
        batch id, else the beginning of the results topic.
        """
        return self._read(BatchTally(batch_id), timeout_s, since, partial=partial)

    def _read(
        self, tally: BatchTally, timeout_s: float | None, since: float | None, *, partial: bool
    ) -> Iterator[InferenceResult]:
        if partial:
            return self._answered(tally, since if since is not None else batch_time(tally.batch_id))
        return self._results(tally, timeout_s, since)

    def _results(
        self, tally: BatchTally, timeout_s: float | None, since: float | None
    ) -> Iterator[InferenceResult]:
        kafka = self.config.kafka
        since = since if since is not None else batch_time(tally.batch_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        consumer, partitions = open_reader(kafka, kafka.results_topic, since)
        try:
            yield from batch_results(
                consumer, partitions, tally, self._codec_limits, until_end=False, deadline=deadline
            )
        finally:
            consumer.close()
        if tally.void and not tally.complete:
            raise PublishIncompleteError(f"batch {tally.batch_id}: {VOID}")
        if not tally.complete:
            assert timeout_s is not None  # without a deadline only completion ends the loop
            status = tally.status(
                submitted_at=since, now=time.time(), completion_window_s=None, price_per_1k=None
            )
            raise CollectTimeoutError(status, timeout_s)

    def collect(
        self,
        batch_id: str,
        output: TextTarget,
        errors: TextTarget,
        timeout_s: float | None = None,
        *,
        since: float | None = None,
        progress: Progress | None = None,
        on_wait: Callable[[str], None] | None = None,
        partial: bool = False,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        model: str | None = None,
    ) -> BatchStatus:
        """Write the batch's results as JSONL as they arrive, until it is complete; with
        ``partial``, the results answered now, and return (its status says how far the
        batch is).

        ``max_tokens`` (prompt + completion, in [1, 10¹²]) and ``max_cost_usd`` (in
        (0, 1,000,000], priced at ``api.prices`` of ``model``) cap the batch while it is
        followed, as ``batchpipe serve`` caps one (docs/architecture.md §12): once its
        answers' usage reaches a cap, its ``capped`` stop is announced on the control
        topic, the lines not run arrive as 4008 ``batch_cap_reached`` and are written to
        ``errors``, and the status's ``capped`` says which cap stopped it at what spend.
        A cap that cannot be read raises :class:`~batchpipe.caps.CapError` (a
        ``ValueError`` naming the argument) before anything is read; with ``partial``
        (nothing followed) a cap is refused the same way.

        Completions go to ``output``, failures to ``errors`` (paths are truncated first;
        open text streams are written as they are), one line per ``custom_id``.
        ``progress`` is told ``(answered, total)`` after each new result and closed at
        the end. Raises :class:`CollectTimeoutError` (files hold what arrived) on timeout,
        :class:`BatchNotFoundError` at once (no file written) when neither a request nor a
        result of the batch is on its topics, even in a transaction not committed yet: a
        mistyped id would otherwise be waited on for ever. A batch published but not
        visible yet (its publisher's transaction open) is waited for within
        ``timeout_s``, and ``on_wait`` told why once; :class:`PublishIncompleteError` at
        once when its publisher stopped before its end marker (none of it runs).
        """
        started = time.monotonic()
        cap = given_cap(max_tokens, max_cost_usd, model, self.config.api.prices)
        if cap.limits and partial:
            raise CapError("max_tokens: a partial read does not follow the batch", "max_tokens")
        self._require(batch_id, since, timeout_s, on_wait)
        if timeout_s is not None:
            timeout_s = max(0.0, timeout_s - (time.monotonic() - started))
        tally = BatchTally(batch_id)
        progress = progress or Progress()
        with contextlib.ExitStack() as stack:
            out, err = (_open_text(stack, target) for target in (output, errors))
            watch = self._watch(stack, cap) if cap.limits else None
            try:
                for result in self._read(tally, timeout_s, since, partial=partial):
                    write_result(result, out, err)
                    progress.update(tally.answered, tally.total)
                    if watch is not None:
                        watch.see(tally)
            finally:
                progress.close()
        status = tally.status(
            submitted_at=since if since is not None else batch_time(batch_id),
            now=time.time(),
            completion_window_s=None,
            price_per_1k=None,
        )
        return status if watch is None else replace(status, capped=watch.summary(tally))

    def _watch(self, stack: contextlib.ExitStack, cap: Cap) -> CapWatch:
        """The follower of a capped batch's spend, its stop's producer opened now (a stop
        then waits on nothing: every answer until the workers read it is over the cap)."""
        announcer = Announcer(self.config.kafka)
        stack.callback(announcer.close)
        announcer.open()
        return CapWatch(cap, announcer.announce)

    def status(
        self,
        batch_id: str,
        *,
        since: float | None = None,
        completion_window_s: float | None = DEFAULT_COMPLETION_WINDOW_S,
        price_per_1k: float | None = None,
    ) -> BatchStatus:
        """Counts, tokens and state of a batch, from the results topic read to its end.

        ``state`` is ``completed`` once every request is answered, ``expired`` when the
        completion window since submission passed first, else ``in_progress``. While no
        result exists yet, the batch size and submit time come from its first request.
        Raises :class:`BatchNotFoundError` when neither topic holds anything of it, even in
        a transaction not committed yet. With no answer yet, ``detail`` says when it is
        published but not visible yet or still being published, and a batch whose
        publisher stopped before its end marker is ``failed`` (none of it runs).
        """
        since = since if since is not None else batch_time(batch_id)
        tally = BatchTally(batch_id)
        for _ in self._answered(tally, since):
            pass
        submitted_at, detail, now = since, None, time.time()
        seen: Sighting | None = None
        if tally.total == 0 or submitted_at is None:
            seen = self.sighting(batch_id, since)
            first = seen.request
            if first is None and tally.answered == 0 and not seen.hidden:
                raise self._not_found(batch_id)
            if first is not None:
                tally.total = max(tally.total, first.batch_total)
                submitted_at = first.submitted_at
            if tally.answered == 0:
                detail = seen.detail(now)
            if tally.answered == 0 and seen.interrupted(now):
                return replace(
                    tally.status(
                        submitted_at=submitted_at,
                        now=now,
                        completion_window_s=None,
                        price_per_1k=price_per_1k,
                    ),
                    state="failed",
                    detail=detail,
                    tier=seen.tier,
                )
        status = tally.status(
            submitted_at=submitted_at,
            now=now,
            completion_window_s=completion_window_s,
            price_per_1k=price_per_1k,
        )
        # its tier is on its requests: read up to its first one (from ``since``)
        tier = (seen or self.sighting(batch_id, since)).tier
        return replace(status, detail=detail, tier=tier)

    def _require(
        self,
        batch_id: str,
        since: float | None,
        timeout_s: float | None,
        on_wait: Callable[[str], None] | None,
    ) -> None:
        """Return once a request of the batch is readable or a result of it is there;
        wait, within ``timeout_s``, while it is only published in a transaction not
        committed yet (``on_wait`` told once); raise :class:`BatchNotFoundError` at once
        when nothing of it is on its topics, :class:`PublishIncompleteError` when its
        publisher stopped before its end marker."""
        since = since if since is not None else batch_time(batch_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while True:
            seen = self.sighting(batch_id, since)
            if seen.request is not None and seen.interrupted(time.time()):
                for _ in self._answered(BatchTally(batch_id), since):
                    return  # answered all the same (an earlier attempt): collected
                raise PublishIncompleteError(f"batch {batch_id}: {seen.detail(time.time())}")
            if seen.request is not None:
                # being published (its end marker or seal to come): collect waits, and says so
                if on_wait is not None and (detail := seen.detail(time.time())):
                    on_wait(f"batch {batch_id}: {detail}; waiting")
                return
            for _ in self._answered(BatchTally(batch_id), since):
                return
            if not seen.hidden:
                raise self._not_found(batch_id)
            if not told and on_wait is not None:
                on_wait(f"batch {batch_id}: {NOT_VISIBLE}; waiting")
                told = True
            if deadline is not None and time.monotonic() >= deadline:
                status = BatchTally(batch_id).status(
                    submitted_at=since, now=time.time(), completion_window_s=None, price_per_1k=None
                )
                raise CollectTimeoutError(replace(status, detail=NOT_VISIBLE), timeout_s or 0.0)
            wait = (
                LOOK_AGAIN_S if deadline is None else min(LOOK_AGAIN_S, deadline - time.monotonic())
            )
            time.sleep(max(0.0, wait))

    def _answered(self, tally: BatchTally, since: float | None) -> Iterator[InferenceResult]:
        """The batch's answers on the results topic, read to its end (none without it)."""
        reader = self.reader(self.config.kafka.results_topic, since)
        if reader is None:
            return
        consumer, partitions = reader
        try:
            yield from batch_results(
                consumer, partitions, tally, self._codec_limits, until_end=True, deadline=None
            )
        finally:
            consumer.close()

    def reader(
        self, topic: str, since: float | None, *, committed: bool = True
    ) -> tuple[Consumer, int] | None:
        """A reader of every partition of ``topic`` from ``since`` (unix seconds; None: the
        beginning), as :func:`~batchpipe.collect.open_reader`; None when there is no such
        topic."""
        try:
            return open_reader(self.config.kafka, topic, since, committed=committed)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise

    def _not_found(self, batch_id: str) -> BatchNotFoundError:
        kafka = self.config.kafka
        return BatchNotFoundError(
            f"no request or result of batch {batch_id!r} on "
            f"{' / '.join(self.routing.topics)} / {kafka.results_topic}: is the id right? "
            "(batchpipe list shows the recent batches)"
        )

    def _first_request(self, batch_id: str, since: float | None) -> InferenceRequest | None:
        """The first request of the batch on a requests topic it may be routed to, None if
        there is none."""
        return self.sighting(batch_id, since).request

    def sighting(self, batch_id: str, since: float | None) -> Sighting:
        """What the batch's requests topics, then its pending topics, hold of it: its
        first request, read_committed; on a pending topic (§10) also whether it ended with
        its end marker and when its newest record or heartbeat was written — looked at
        whatever this client's own scheduling.fair says, since its publisher may have had
        the other setting. With no request readable, whether one is there read_uncommitted:
        published in a transaction not committed yet."""
        for topic in self.routing.topics:
            found = self._scan(topic, batch_id, since, committed=True)
            if found.request is not None:
                if found.gated:
                    found.seal = self._seal_of(batch_id, since)
                return found
        seen = Sighting()
        for topic in (pending_topic(t) for t in self.routing.topics):
            found = self._scan(topic, batch_id, since, committed=True, pending=True)
            seen.request = seen.request or found.request
            seen.tier = seen.tier or found.tier
            seen.sealed, seen.ended = seen.sealed or found.sealed, seen.ended or found.ended
            if found.last_at is not None:
                seen.last_at = max(seen.last_at or 0.0, found.last_at)
        if seen.request is not None:
            return seen
        for topic in self.routing.topics:
            if self._scan(topic, batch_id, since, committed=False).request is not None:
                return Sighting(hidden=True)
        return seen

    def _scan(
        self,
        topic: str,
        batch_id: str,
        since: float | None,
        *,
        committed: bool,
        pending: bool = False,
    ) -> Sighting:
        """One topic's part of :meth:`sighting`: a requests topic is read until the
        batch's first request, a pending topic to its end (its end marker and heartbeats)."""
        seen = Sighting()
        reader = self.reader(topic, since, committed=committed)
        if reader is None:
            return seen  # a route nothing was ever published to
        consumer, partitions = reader
        try:
            for msg in records(consumer, partitions, until_end=True, deadline=None):
                headers = record_headers(msg)
                if pending:
                    to = scheduled_as(headers)
                    if to.batch_id != batch_id:
                        continue
                    seen.sealed, seen.ended = seen.sealed or to.sealed, seen.ended or to.end
                    kind, at_ms = msg.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE:
                        seen.last_at = max(seen.last_at or 0.0, at_ms / 1000)
                    if seen.request is not None or msg.value() is None:
                        continue
                try:
                    req = decode_request(msg.value(), headers, self._codec_limits)
                except RequestError:
                    continue
                if req.batch_id == batch_id:
                    seen.request, seen.tier = req, tier_in(headers)
                    if not pending:
                        seen.gated = sealed_by_control(headers)
                        return seen
        finally:
            consumer.close()
        return seen

    def _seal_of(self, batch_id: str, since: float | None) -> Seal | None:
        """The newest seal of ``batch_id`` on the control topic (read from ``since``)."""
        reader = self.reader(self.config.kafka.control_topic, since)
        if reader is None:
            return None
        consumer, partitions = reader
        key, seal = Seal(batch_id, "open", 0.0).key, None
        try:
            for msg in records(consumer, partitions, until_end=True, deadline=None):
                value = msg.value()
                if msg.key() == key and value is not None:
                    with contextlib.suppress(ValueError):
                        seal = Seal.decode(value)
        finally:
            consumer.close()
        return seal


def _open_text(stack: contextlib.ExitStack, target: TextTarget) -> TextIO:
    if isinstance(target, (str, os.PathLike)):
        return stack.enter_context(Path(target).open("w", encoding="utf-8"))
    return target
