"""Reading one batch's answers back from a topic that holds every job's.

Readers never join a consumer group and never commit: they ``assign()`` every
partition at an explicit offset — the first record written at or after the batch's
submit time (``offsets_for_times``), less :data:`CLOCK_SKEW_S` because the results
carry the worker machines' timestamps. The submit time comes from the batch id
(``batch_<unix_ms>_<hex>``, see :func:`new_batch_id`) or from the caller; without one a
reader starts at the beginning of the topic. A broker whose timestamp index is coarse
(Tansu answers 0 for a time past its last record) makes a reader start earlier than
needed: still correct, only slower.

Answers are deduplicated per ``custom_id`` (the first one wins): a topic can hold a
result twice after a worker restart, a resubmitted batch or, on brokers that deliver
aborted transactions, a retried one. Only the set of seen ids is kept in memory.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from worker.config import KafkaConfig
from worker.errors import ErrorCode, RequestError
from worker.kafka import clients
from worker.kafka.consumer import FROM_START
from worker.wire.answers import format_result_line
from worker.wire.codec import CodecLimits, decode_result
from worker.wire.messages import InferenceResult

#: Seconds a reader starts before the submit time: the topic's timestamps come from
#: other machines' clocks.
CLOCK_SKEW_S = 60.0
POLL_S = 0.5
METADATA_TIMEOUT_S = 30.0
READER_GROUP = "batchpipe-reader"  # required by librdkafka; never joined, never committed

State = Literal["in_progress", "completed", "expired", "failed"]

_GENERATED_ID = re.compile(r"batch_(\d{13})_[0-9a-f]+")


def new_batch_id(submitted_at: float) -> str:
    """``batch_<unix_ms>_<16 hex>``: unique, and it tells readers where to start."""
    return f"batch_{int(submitted_at * 1000)}_{secrets.token_hex(8)}"


def batch_time(batch_id: str) -> float | None:
    """The submit time (unix seconds) inside a generated batch id, None for other ids."""
    match = _GENERATED_ID.fullmatch(batch_id)
    return int(match.group(1)) / 1000 if match else None


def open_reader(
    kafka: KafkaConfig, topic: str, since: float | None, *, committed: bool = True
) -> tuple[Consumer, int]:
    """A read_committed consumer (``committed`` False: read_uncommitted, records of open
    transactions too) assigned to every partition of ``topic``.

    It starts at the first record at or after ``since - CLOCK_SKEW_S`` (unix seconds),
    at the beginning when ``since`` is None. Returns it with its partition count.
    """
    consumer = clients.consumer(
        kafka, READER_GROUP, read_committed=committed, extra={"enable.partition.eof": True}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no topic {topic}"))
        partitions = sorted(metadata.partitions)
        consumer.assign(start_offsets(consumer, topic, partitions, since))
    except BaseException:
        consumer.close()
        raise
    return consumer, len(partitions)


def start_offsets(
    consumer: Consumer, topic: str, partitions: list[int], since: float | None
) -> list[TopicPartition]:
    """Where a reader of ``topic`` from ``since`` (see :func:`open_reader`) starts."""
    if since is None:
        return [TopicPartition(topic, p, FROM_START) for p in partitions]
    # The end offsets are read first: a partition with nothing after `since` is
    # read from there, so records written meanwhile are not skipped.
    ends = [
        consumer.get_watermark_offsets(
            TopicPartition(topic, p), timeout=METADATA_TIMEOUT_S, cached=False
        )[1]
        for p in partitions
    ]
    at_ms = max(0, int((since - CLOCK_SKEW_S) * 1000))
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, at_ms) for p in partitions], timeout=METADATA_TIMEOUT_S
    )
    return [
        TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else end)
        for tp, end in zip(found, ends, strict=True)
    ]


def records(
    consumer: Consumer, partitions: int, *, until_end: bool, deadline: float | None
) -> Iterator[Message]:
    """Yield records until ``deadline`` (``time.monotonic()``) or, with ``until_end``,
    until every partition has been read to its end once."""
    at_end: set[int] = set()
    while deadline is None or time.monotonic() < deadline:
        wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        msg = consumer.poll(wait)
        if msg is None:
            continue
        error = msg.error()
        if error is None:
            yield msg
        elif error.code() == KafkaError._PARTITION_EOF:
            at_end.add(msg.partition() or 0)
            if until_end and len(at_end) >= partitions:
                return
        elif error.fatal() or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaException(error)
        # anything else is transient: librdkafka retries on its own


def record_headers(msg: Message) -> list[tuple[str, str | bytes | None]]:
    headers = msg.headers() or []
    return list(headers.items()) if isinstance(headers, dict) else headers


@dataclass(frozen=True)
class BatchStatus:
    """Where a batch stands, as far as its results on the results topic tell.

    ``total`` is 0 while unknown. ``cost`` is set when a price per 1k tokens was given;
    it prices prompt + completion tokens (reasoning tokens are part of the completion).
    """

    batch_id: str
    total: int
    completed: int
    failed: int
    state: State
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost: float | None
    submitted_at: float | None = None
    #: why a batch with no answer yet is where it is: published but not visible yet, still
    #: being published, or (``failed``) its publisher stopped before it ended
    detail: str | None = None
    #: the service tier its requests ask for (None: none of them was read)
    tier: str | None = None
    #: which cap stopped the batch, at what spend, when its collector followed it under a
    #: cap (:class:`batchpipe.caps.CapWatch`); None when none did
    capped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI batch object's fields that apply, plus token usage and cost."""
        extra: dict[str, Any] = {} if self.detail is None else {"detail": self.detail}
        if self.tier is not None:  # as serve's batch object carries it
            extra["batchpipe"] = {"tier": self.tier}
        if self.state == "failed" and self.detail is not None:
            extra["errors"] = {
                "object": "list",
                "data": [{"code": "publish_incomplete", "message": self.detail}],
            }
        return {
            "id": self.batch_id,
            "object": "batch",
            "status": self.state,
            # whole seconds, as OpenAI's Batch.created_at
            "created_at": None if self.submitted_at is None else int(self.submitted_at),
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
            "cost": self.cost,
        } | extra


class BatchTally:
    """The distinct answers of one batch, counted as they stream by."""

    def __init__(self, batch_id: str, total: int = 0) -> None:
        self.batch_id = batch_id
        self.total = total
        self.completed = 0
        self.failed = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        #: an answer said the batch's publish never ended (4009): none of it runs
        self.void = False
        self._seen: set[str] = set()

    @property
    def answered(self) -> int:
        return len(self._seen)

    @property
    def complete(self) -> bool:
        """Every request has its answer: distinct custom_ids answered == batch_total."""
        return self.total > 0 and self.answered >= self.total

    def add(self, result: InferenceResult) -> bool:
        """Count ``result``; False (and nothing counted) for another batch or a duplicate."""
        if result.batch_id != self.batch_id or result.custom_id in self._seen:
            return False
        self._seen.add(result.custom_id)
        self.total = max(self.total, result.batch_total)
        if result.status == "completed":
            self.completed += 1
        else:
            self.failed += 1
            self.void = self.void or (
                result.error is not None and result.error.code == ErrorCode.PUBLISH_INCOMPLETE
            )
        self.prompt_tokens += result.usage.prompt_tokens
        self.completion_tokens += result.usage.completion_tokens
        self.reasoning_tokens += result.usage.reasoning_tokens
        return True

    def status(
        self,
        *,
        submitted_at: float | None,
        now: float,
        completion_window_s: float | None,
        price_per_1k: float | None,
    ) -> BatchStatus:
        state: State = "in_progress"
        if self.complete:
            state = "completed"
        elif self.void:
            state = "failed"
        elif (
            submitted_at is not None
            and completion_window_s is not None
            and now > submitted_at + completion_window_s
        ):
            state = "expired"
        tokens = self.prompt_tokens + self.completion_tokens
        return BatchStatus(
            batch_id=self.batch_id,
            total=self.total,
            completed=self.completed,
            failed=self.failed,
            state=state,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            reasoning_tokens=self.reasoning_tokens,
            cost=None if price_per_1k is None else tokens / 1000 * price_per_1k,
            submitted_at=submitted_at,
        )


def batch_results(
    consumer: Consumer,
    partitions: int,
    tally: BatchTally,
    limits: CodecLimits,
    *,
    until_end: bool,
    deadline: float | None,
) -> Iterator[InferenceResult]:
    """Yield each new answer of ``tally``'s batch once; stop when the batch is complete or
    void (:attr:`BatchTally.void`: no more answers come), at ``deadline``, or
    (``until_end``) at the end of the topic.

    Records that are not results (undecodable) belong to no batch and are skipped.
    """
    if tally.complete:
        return
    for msg in records(consumer, partitions, until_end=until_end, deadline=deadline):
        try:
            result = decode_result(msg.value(), record_headers(msg), limits)
        except RequestError:
            continue
        if tally.add(result):
            yield result
            if tally.complete or (tally.void and not until_end):
                return


def result_line(result: InferenceResult) -> str:
    """The OpenAI batch output line of a completed result, the error line of a failed
    one, as every output and error file holds it (newline included)."""
    return json.dumps(format_result_line(result), ensure_ascii=False) + "\n"


def write_result(result: InferenceResult, output: TextIO, errors: TextIO) -> None:
    """One line in the OpenAI batch output shape: completions to ``output``, failures to
    ``errors`` (as OpenAI and Bailian split them)."""
    (output if result.status == "completed" else errors).write(result_line(result))
