"""encode → publish: every answer leaves the worker through here.

An answer is a result on the results topic or, for a record without a recoverable
``custom_id``, a dead letter. Each is counted in the metrics and closed in the
:class:`~worker.loop.ledger.Ledger` once it counts as given (see :mod:`worker.kafka.publisher`).

An answer bigger than the producers' ``message.max.bytes`` is never fatal, and never
lost: a result becomes a 4003 error result for its request (text and metadata dropped);
a dead letter first drops the original headers, keeping the original key and value, and
when even those do not fit it becomes a 4003 dead letter that names the size and the
original error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from functools import partial
from types import MappingProxyType

from msgspec import structs

from batcher import Partition
from worker.config import KafkaConfig
from worker.errors import ErrorCode
from worker.kafka.produce import Headers
from worker.kafka.publisher import MessageTooLarge, OnAnswered, Publisher
from worker.loop.intake import DeadLetter
from worker.loop.jobs import Identity, Job, Source, failed
from worker.loop.ledger import Ledger
from worker.obs.metrics import WorkerMetrics
from worker.wire.codec import encode_result
from worker.wire.messages import ErrorInfo, InferenceResult
from worker.wire.validation import escaped

log = logging.getLogger("batchpipe.worker")

#: the most characters of an error message a dead letter carries in its header
MAX_ERROR_MESSAGE = 1000


class Outbox:
    def __init__(
        self,
        kafka: KafkaConfig,
        publisher: Publisher,
        ledger: Ledger,
        metrics: WorkerMetrics,
        identity: Identity,
    ) -> None:
        self._kafka = kafka
        self._publisher = publisher
        self._ledger = ledger
        self._metrics = metrics
        self._identity = identity
        # the encode and produce stages' seconds since :meth:`add_stages`: a stage timer
        # per answer took the metrics' lock twice per request (issue 42). Loop thread only:
        # :meth:`result` and :meth:`add_stages` run there (neither locks), so no add is lost
        self._encode_s = 0.0
        self._produce_s = 0.0

    def add_stages(self) -> None:
        """Add the encode and produce time gathered since the last call to the stage
        counters: the worker calls it once per loop step, before the metrics flush."""
        if self._encode_s or self._produce_s:
            self._metrics.add_stage("encode", self._encode_s)
            self._metrics.add_stage("produce", self._produce_s)
            self._encode_s = self._produce_s = 0.0

    def forget(self, partitions: Collection[Partition]) -> None:
        """``partitions`` are no longer this worker's (revoked, lost) or were rewound: answers
        to them not sent yet are dropped."""
        self._publisher.forget(partitions)

    def result(
        self,
        result: InferenceResult,
        source: Source,
        queued_s: float = 0.0,
        submitted_at: float | None = None,
    ) -> None:
        try:
            self._send_result(result, source, queued_s, submitted_at)
            return
        except MessageTooLarge as exc:
            log.warning("answer to %s: %s; answering 4003", source.position, exc)
            too_large = exc
        slim = _over_limit(result, f"the answer is {too_large.size} bytes, {_over(too_large)}")
        try:
            self._send_result(slim, source, queued_s, submitted_at)
        except MessageTooLarge as exc:  # the custom_id alone is too large
            self._oversized_letter(
                source,
                f"the answer is {exc.size} bytes even without its text and metadata, "
                f"{_over(exc)}: its custom_id is too long",
            )

    def failure(self, job: Job, code: ErrorCode, message: str) -> None:
        """Answer a job that will not run (deadline passed, engine hung) with an error."""
        request = job.request
        result = failed(request.custom_id, code, message, identity=self._identity, request=request)
        self.result(result, job.source, submitted_at=request.submitted_at)

    def dead_letter(self, letter: DeadLetter) -> None:
        source = letter.source
        log.warning(
            "dead-lettering %s: %d %s",
            source.position,
            letter.code,
            letter.message,
            extra={"code": int(letter.code)},
        )
        added = _error_headers(letter.code, letter.message, source)
        value = letter.value or b""
        try:
            self._send_letter(source, letter.code, source.key, value, [*letter.headers, *added])
            return
        except MessageTooLarge:
            pass
        try:  # the original headers go; the original key and value stay
            self._send_letter(source, letter.code, source.key, value, added)
        except MessageTooLarge as exc:
            self._oversized_letter(
                source,
                f"the dead letter of a {len(value)}-byte value is {exc.size} bytes, {_over(exc)}; "
                f"the original key, value and headers were dropped "
                f"(error {int(letter.code)}: {letter.message})",
            )

    def _send_result(
        self, result: InferenceResult, source: Source, queued_s: float, submitted_at: float | None
    ) -> None:
        start = time.perf_counter()
        try:
            value, headers = encode_result(result)
        finally:
            encoded = time.perf_counter()
            self._encode_s += encoded - start

        def answered() -> None:
            if self._ledger.close(source):
                e2e = time.time() - submitted_at if submitted_at else None
                usage = result.usage
                self._metrics.answered(
                    result.status,
                    result.error.code if result.error else None,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.reasoning_tokens,
                    e2e,
                    queued_s,
                )

        try:
            # the key as encode_result writes the custom_id: never unencodable
            self._send(
                self._kafka.results_topic,
                escaped(result.custom_id),
                value,
                headers,
                source,
                answered,
            )
        finally:
            self._produce_s += time.perf_counter() - encoded

    def _oversized_letter(self, source: Source, reason: str) -> None:
        """The last resort: a 4003 dead letter without the original key, value and headers."""
        log.warning("dead-lettering %s: %d %s", source.position, ErrorCode.OVER_LIMIT, reason)
        headers = _error_headers(ErrorCode.OVER_LIMIT, reason, source)
        self._send_letter(source, ErrorCode.OVER_LIMIT, None, b"", headers)

    def _send_letter(
        self, source: Source, code: ErrorCode, key: bytes | None, value: bytes, headers: Headers
    ) -> None:
        def answered() -> None:
            if self._ledger.close(source):
                self._metrics.dead_lettered(code)

        self._send(self._kafka.dead_letter_topic, key, value, headers, source, answered)

    def _send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        source: Source,
        answered: OnAnswered,
    ) -> None:
        origin = (source.topic, source.partition)
        free = partial(self._ledger.free, source)
        self._publisher.send(topic, key, value, headers, origin, answered, source.offset, free)


def _over(exc: MessageTooLarge) -> str:
    return f"over {exc.setting}"


def _over_limit(result: InferenceResult, message: str) -> InferenceResult:
    """``result`` as a 4003 failure without its text and metadata; ids, counts and timings
    stay, so that ``collect`` and ``status`` count it in its batch."""
    return structs.replace(
        result,
        status="failed",
        text="",
        finish_reason="error",
        metadata=MappingProxyType({}),
        error=ErrorInfo(code=int(ErrorCode.OVER_LIMIT), message=message),
    )


def _error_headers(code: ErrorCode, message: str, source: Source) -> list[tuple[str, bytes]]:
    """What a dead letter adds to a record; the message is cut to a bounded length."""
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[: MAX_ERROR_MESSAGE - 1] + "…"
    return [
        ("error-code", str(int(code)).encode()),
        ("error-message", escaped(message).encode()),
        ("source", source.position.encode()),
    ]
