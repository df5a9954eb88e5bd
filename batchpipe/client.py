"""The Python client: submit a batch, watch it, collect its results.

``Client`` is the one code path behind the ``batchpipe submit``, ``status`` and
``collect`` commands, configured exactly as the worker is (:mod:`worker.config`).

    client = Client(bootstrap="127.0.0.1:9092")
    receipt = client.submit_file("batch.jsonl")
    client.collect(receipt.batch_id, "output.jsonl", "errors.jsonl", timeout_s=600)
    print(client.status(receipt.batch_id).completed)

A batch is published in one Kafka transaction — all of its requests or none — after
every request passed validation (:mod:`batchpipe.batchfile`), each request to its model's
requests topic (``kafka.routes``, :mod:`worker.routing`). Results are read with
``read_committed`` consumers that start at the batch's submit time (see
:mod:`batchpipe.collect`) and never join a group or commit offsets.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException
from msgspec import structs

from batchpipe.batchfile import (
    DEFAULT_LIMITS,
    FileLimits,
    iter_file,
    scan_file,
    validate_requests,
)
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
from batchpipe.paced import paced
from batchpipe.progress import Progress
from worker.config import Config, load_config, producer_max_bytes
from worker.errors import BatchpipeError, RequestError
from worker.feeder.estimate import request_tokens
from worker.feeder.headers import MAX_ID_CHARS
from worker.feeder.naming import (
    check_weight,
    end_marker,
    ensure_pending,
    pending_headers,
    pending_topic,
    tokens_header,
)
from worker.kafka import clients
from worker.kafka.produce import produce
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
    "SubmitReceipt",
]

DEFAULT_COMPLETION_WINDOW_S = 24 * 3600.0
TRANSACTION_TIMEOUT_S = 30.0
#: Kafka's default cap on a transaction's lifetime (transaction.max.timeout.ms) is 15 min;
#: a 500 MB file must fit in it, and its commit waits for the last deliveries.
TRANSACTION_LIFETIME_S = 600.0

TextTarget = str | os.PathLike[str] | TextIO
#: with fair share, a batch is published in transactions of at most this many records or
#: seconds, then its end marker: a long upload's open transaction never hides the batches
#: committed after it for longer (the feeder reads read_committed and holds a batch until
#: its end marker: docs/architecture.md §10, "Publish in chunks")
CHUNK_RECORDS = 5_000
CHUNK_S = 0.5
CHUNK_BYTES = 64 * 1024 * 1024
#: a chunk's transaction.timeout.ms: a publisher killed mid-publish leaves its last chunk
#: open, hiding later batches, this long at most on Apache Kafka (was 600 s for a batch)
CHUNK_TIMEOUT_S = 60.0


class _Chunk:
    """The records of the transaction in progress, and per pending topic of the batch."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._records, self._bytes, self._started = 0, 0, time.monotonic()

    def full(self, topic: str, size: int) -> bool:
        """One more record of ``size`` bytes on ``topic``; True when the transaction is
        to commit now."""
        self.counts[topic] += 1
        self._records, self._bytes = self._records + 1, self._bytes + size
        if (
            self._records < CHUNK_RECORDS
            and self._bytes < CHUNK_BYTES
            and time.monotonic() - self._started < CHUNK_S
        ):
            return False
        return self.commit()

    def commit(self) -> bool:
        """True when the transaction holds records (it is to commit now); starts anew."""
        held = self._records
        self._records, self._bytes, self._started = 0, 0, time.monotonic()
        return held > 0


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
    ) -> SubmitReceipt:
        """Validate and publish requests (dataclasses or OpenAI/Bailian batch-line dicts).

        Raises :class:`~batchpipe.batchfile.BatchFileError` (nothing published) when any
        request is invalid, :class:`~worker.routing.UnroutedModelError` (nothing published)
        when routes are configured and a request's model has none, ``KafkaException`` when
        publishing fails (nothing of the batch is run: with fair share it is published in
        short transactions and the feeder holds it until its end marker, written last).

        With ``scheduling.fair`` the batch goes to the pending topic, and the feeder moves
        it on by fair share (docs/architecture.md §10): ``key`` names whose share it takes
        (the publisher's: a key's batches together get one key's share), ``weight``
        (default ``scheduling.weight``) is its share against other keys and within its
        key against its other batches; ``ValueError`` when it is not in [0.001, 1000],
        or when ``batch_id`` or ``key`` fails :func:`check_name`.
        """
        checked = validate_requests(requests, self.limits)
        models = {r.model for r in checked}
        return self._publish(checked, len(checked), batch_id, models, weight, key)

    def submit_file(
        self,
        path: str | os.PathLike[str],
        batch_id: str | None = None,
        *,
        weight: float | None = None,
        key: str = "",
    ) -> SubmitReceipt:
        """Validate and publish a JSONL batch file; see :meth:`submit`.

        The file is streamed twice (validate, then publish), never held in memory.
        """
        scan = scan_file(path, self.limits)
        requests = iter_file(path, self.limits)
        return self._publish(requests, scan.total, batch_id, scan.models, weight, key)

    def publish_file(
        self,
        path: str | os.PathLike[str],
        total: int,
        batch_id: str | None,
        models: Collection[str],
        *,
        weight: float | None = None,
        key: str = "",
    ) -> SubmitReceipt:
        """Publish a file that :func:`~batchpipe.batchfile.scan_file` already accepted
        (the API server validates each file once, at upload, and the CLI before it asks
        the broker), naming ``models``; ``batch_id`` None makes a new one; see :meth:`submit`.

        Publishing again with the same ``batch_id`` fences an earlier publisher of it and
        duplicates nothing that readers count: results are kept once per ``custom_id``.
        """
        requests = iter_file(path, self.limits)
        return self._publish(requests, total, batch_id, models, weight, key)

    def _publish(
        self,
        requests: Iterable[InferenceRequest],
        total: int,
        batch_id: str | None,
        models: Collection[str],
        weight: float | None,
        key: str,
    ) -> SubmitReceipt:
        kafka, fair = self.config.kafka, self.config.scheduling.fair
        check_name(batch_id or "", "batch_id")
        check_name(key, "key")
        share = check_weight(self.config.scheduling.weight if weight is None else weight)
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
        scheduling = pending_headers(batch_id, share, key, sealed=True) if fair else []
        max_tokens = self.config.generation.max_tokens
        producer = clients.producer(
            kafka,
            transactional_id=f"batchpipe-submit-{batch_id}",
            extra={
                "transaction.timeout.ms": int(
                    (CHUNK_TIMEOUT_S if fair else TRANSACTION_LIFETIME_S) * 1000
                ),
                "message.max.bytes": max_bytes,
                # one producer a batch: with sparse connections librdkafka connects to a
                # broker only once it needs one, 50 ms apart, and init_transactions then
                # raced the transaction coordinator's connection and now and then waited
                # 0.5 s on a timer (2-3 % alone, a third of serve's publishes beside a
                # large one's); connecting to every broker at once, it took 3 ms (was 54)
                "enable.sparse.connections": False,
            },
        )
        producer.init_transactions(TRANSACTION_TIMEOUT_S)
        producer.begin_transaction()
        chunk = _Chunk()
        try:
            for req in paced(requests, CHUNK_S) if fair else requests:
                if req is None:  # no line for CHUNK_S: what is written must not hide others
                    if chunk.commit():
                        producer.commit_transaction(TRANSACTION_LIFETIME_S)
                        producer.begin_transaction()
                    continue
                # a model not scanned (the file changed since): routed, or refused, now
                topic = routes.get(req.model) or self.routing.topic_for(req.model)
                stamped = structs.replace(
                    req, batch_id=batch_id, batch_total=total, submitted_at=submitted_at
                )
                value, headers = encode_request(stamped)
                if fair:
                    tokens = tokens_header(request_tokens(req, max_tokens))
                    topic, headers = pending_topic(topic), [*headers, *scheduling, tokens]
                produce(producer, topic, req.custom_id.encode(), value, headers)
                if fair and chunk.full(topic, len(value)):  # an open one hides later batches
                    producer.commit_transaction(TRANSACTION_LIFETIME_S)
                    producer.begin_transaction()
            for topic, count in chunk.counts.items():  # the feeder holds the batch till here
                produce(producer, topic, None, None, end_marker(batch_id, share, key, count))
            producer.commit_transaction(TRANSACTION_LIFETIME_S)
        except BaseException:
            clients.forget_topics(kafka.bootstrap_servers)  # a topic may be gone: ask again
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(TRANSACTION_TIMEOUT_S)
            raise
        return SubmitReceipt(batch_id, total, submitted_at)

    # -- read back ------------------------------------------------------------------

    def results(
        self, batch_id: str, timeout_s: float | None = None, *, since: float | None = None
    ) -> Iterator[InferenceResult]:
        """Yield each request's result once, in arrival order, until the batch is complete.

        Raises :class:`CollectTimeoutError` when ``timeout_s`` passes first. ``since``
        (unix seconds) is where reading starts; by default the time inside a generated
        batch id, else the beginning of the results topic.
        """
        return self._results(BatchTally(batch_id), timeout_s, since)

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
    ) -> BatchStatus:
        """Write the batch's results as JSONL as they arrive, until it is complete.

        Completions go to ``output``, failures to ``errors`` (paths are truncated first;
        open text streams are written as they are), one line per ``custom_id``.
        ``progress`` is told ``(answered, total)`` after each new result and closed at
        the end. Raises :class:`CollectTimeoutError` (files hold what arrived) on timeout,
        :class:`BatchNotFoundError` at once (no file written) when neither a request nor a
        result of the batch is on its topics: a mistyped id would otherwise be waited on
        for ever.
        """
        self._require(batch_id, since)
        tally = BatchTally(batch_id)
        progress = progress or Progress()
        with contextlib.ExitStack() as stack:
            out, err = (_open_text(stack, target) for target in (output, errors))
            try:
                for result in self._results(tally, timeout_s, since):
                    write_result(result, out, err)
                    progress.update(tally.answered, tally.total)
            finally:
                progress.close()
        return tally.status(
            submitted_at=since if since is not None else batch_time(batch_id),
            now=time.time(),
            completion_window_s=None,
            price_per_1k=None,
        )

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
        Raises :class:`BatchNotFoundError` when neither topic holds anything of it.
        """
        since = since if since is not None else batch_time(batch_id)
        tally = BatchTally(batch_id)
        for _ in self._answered(tally, since):
            pass
        submitted_at = since
        if tally.total == 0 or submitted_at is None:
            first = self._first_request(batch_id, since)
            if first is None and tally.answered == 0:
                raise self._not_found(batch_id)
            if first is not None:
                tally.total = max(tally.total, first.batch_total)
                submitted_at = first.submitted_at
        return tally.status(
            submitted_at=submitted_at,
            now=time.time(),
            completion_window_s=completion_window_s,
            price_per_1k=price_per_1k,
        )

    def _require(self, batch_id: str, since: float | None) -> None:
        """Raise :class:`BatchNotFoundError` unless a request or a result of the batch is
        on its topics (a request first: the first one found ends the search)."""
        since = since if since is not None else batch_time(batch_id)
        if self._first_request(batch_id, since) is not None:
            return
        for _ in self._answered(BatchTally(batch_id), since):
            return
        raise self._not_found(batch_id)

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

    def reader(self, topic: str, since: float | None) -> tuple[Consumer, int] | None:
        """A reader of every partition of ``topic`` from ``since`` (unix seconds; None: the
        beginning), as :func:`~batchpipe.collect.open_reader`; None when there is no such
        topic."""
        try:
            return open_reader(self.config.kafka, topic, since)
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
        # not fed yet: still on the pending topic (§10) — looked at whatever this client's
        # own scheduling.fair says, since its publisher may have had the other setting
        topics = [*self.routing.topics, *(pending_topic(t) for t in self.routing.topics)]
        for topic in topics:
            reader = self.reader(topic, since)
            if reader is None:
                continue  # a route nothing was ever published to
            consumer, partitions = reader
            try:
                for msg in records(consumer, partitions, until_end=True, deadline=None):
                    try:
                        req = decode_request(msg.value(), record_headers(msg), self._codec_limits)
                    except RequestError:
                        continue
                    if req.batch_id == batch_id:
                        return req
            finally:
                consumer.close()
        return None


def _open_text(stack: contextlib.ExitStack, target: TextTarget) -> TextIO:
    if isinstance(target, (str, os.PathLike)):
        return stack.enter_context(Path(target).open("w", encoding="utf-8"))
    return target
