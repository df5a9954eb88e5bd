"""encode → publish: every answer leaves the worker through here.

An answer is a result on the results topic or, for a record without a recoverable
``custom_id``, a dead letter. Each is counted in the metrics and closed in the
:class:`~worker.ledger.Ledger` once it counts as given (see :mod:`worker.kafka.publisher`).
"""

from __future__ import annotations

import logging
import time

from worker.config import KafkaConfig
from worker.errors import ErrorCode
from worker.intake import DeadLetter
from worker.jobs import Identity, Job, Source, failed
from worker.kafka.publisher import Publisher
from worker.ledger import Ledger
from worker.obs.metrics import WorkerMetrics
from worker.wire.codec import encode_result
from worker.wire.messages import InferenceResult
from worker.wire.validation import escaped

log = logging.getLogger("batchpipe.worker")


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

    def result(
        self,
        result: InferenceResult,
        source: Source,
        queued_s: float = 0.0,
        submitted_at: float | None = None,
    ) -> None:
        with self._metrics.stage("encode"):
            value, headers = encode_result(result)

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

        with self._metrics.stage("produce"):
            self._publisher.send(
                self._kafka.results_topic,
                escaped(result.custom_id),  # as encode_result writes it: never unencodable
                value,
                headers,
                (source.topic, source.partition),
                answered,
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
        headers = [
            *letter.headers,
            ("error-code", str(int(letter.code)).encode()),
            ("error-message", letter.message.encode()),
            ("source", source.position.encode()),
        ]

        def answered() -> None:
            if self._ledger.close(source):
                self._metrics.dead_lettered(letter.code)

        self._publisher.send(
            self._kafka.dead_letter_topic,
            source.key,
            letter.value or b"",
            headers,
            (source.topic, source.partition),
            answered,
        )
