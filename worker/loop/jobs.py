"""A request's life inside one worker, and the answers built from it.

A :class:`Job` is what the batcher carries as its payload: the decoded request, the
engine's input, where the request came from (for offsets) and when it arrived. The
answer helpers build exactly one :class:`~worker.wire.messages.InferenceResult` per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from msgspec import structs

from worker.engines.base import Completion, EngineInput
from worker.errors import ErrorCode
from worker.wire.messages import ErrorInfo, InferenceRequest, InferenceResult, Timings, Usage


@dataclass(frozen=True)
class Source:
    """Where a record came from: enough to commit past it and to dead-letter it.

    ``generation`` tells two consumptions of one offset apart: the
    :attr:`~worker.loop.ledger.Ledger.generation` it was read in.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    timestamp_s: float | None = None  # the broker record's create time
    generation: int = 0

    @property
    def position(self) -> str:
        """``topic/partition/offset``: the record, for logs and dead-letter headers."""
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def ref(self) -> str:
        """This consumption of the record: its request's key in the batcher and the engine.

        Unique among requests in flight, also when an offset is read again (after a revoke
        or a rewind) while its previous consumption still runs on the engine, so that the
        old run's completion can never answer, or collide with, the new one.
        """
        return f"{self.position}#{self.generation}"


@dataclass(frozen=True)
class Job:
    request: InferenceRequest
    engine_input: EngineInput
    source: Source
    admitted_at: float  # monotonic seconds, the batcher's clock
    admitted_wall: float  # unix seconds


@dataclass(frozen=True)
class Identity:
    """Who answers: stamped on every result."""

    worker_id: str
    model: str


def queued_seconds(request: InferenceRequest | None, source: Source, admitted_wall: float) -> float:
    """Time from submission (or the record's timestamp) until this worker admitted it."""
    start = request.submitted_at if request and request.submitted_at else source.timestamp_s
    return max(0.0, admitted_wall - start) if start else 0.0


def completed(
    job: Job,
    completion: Completion,
    *,
    identity: Identity,
    batch_size: int,
    dispatched_at: float,
    finished_at: float,
) -> InferenceResult:
    """The answer for a job the engine ran (``completion.error`` makes it a failure)."""
    req = job.request
    error = completion.error
    return InferenceResult(
        custom_id=req.custom_id,
        batch_id=req.batch_id,
        batch_total=req.batch_total,
        metadata=req.metadata,
        status="failed" if error else "completed",
        text=completion.text,
        finish_reason="error" if error else completion.finish_reason,
        usage=Usage(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            reasoning_tokens=completion.reasoning_tokens,
        ),
        error=error,
        timings=Timings(
            queued_s=queued_seconds(req, job.source, job.admitted_wall),
            batch_wait_s=max(0.0, dispatched_at - job.admitted_at),
            engine_s=max(0.0, finished_at - dispatched_at),
        ),
        batch_size=batch_size,
        model=identity.model,
        worker_id=identity.worker_id,
        created_at=time.time(),
        endpoint=req.endpoint,
        logprobs=None if error else completion.logprobs,
        extra_choices=() if error else completion.extra_choices,
        embeddings=() if error else completion.embeddings,
        encoding_format=req.encoding_format,
    )


def failed(
    custom_id: str,
    code: ErrorCode,
    message: str,
    *,
    identity: Identity,
    request: InferenceRequest | None = None,
    param: str | None = None,
) -> InferenceResult:
    """An error answer for a request that never ran; ``param`` names the field at fault."""
    result = InferenceResult(
        custom_id=custom_id,
        status="failed",
        finish_reason="error",
        error=ErrorInfo(code=int(code), message=message, param=param or ""),
        model=identity.model,
        worker_id=identity.worker_id,
        created_at=time.time(),
    )
    if request is None:
        return result
    return structs.replace(
        result,
        batch_id=request.batch_id,
        batch_total=request.batch_total,
        metadata=request.metadata,
        endpoint=request.endpoint,
    )
