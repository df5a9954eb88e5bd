"""``POST /v1/batches/{id}/retry`` (a batchpipe extension; ``batchpipe retry`` and the
console's batch page call it): a new batch of the lines of an ended batch that are worth
running again.

A line is worth retrying when its error is the engine's (5xxx: the engine failed on it,
or hung) — running it again may succeed. Every other error line is listed with why not:
bad input (4001-4003) fails the same way again, and a line that missed its deadline, or
whose batch was cancelled, expired or reached its cap (4004-4006, 4008), was stopped on
purpose. The new batch
reads a new input file of exactly the retried lines, as they were in the first batch's
input, and carries ``metadata.batchpipe_retry_of`` = the first batch's id (with the
first batch's other metadata, up to the 16 pairs a batch holds) and its
``output_expires_after``. The first batch's input and error files must still be there
(either expired or deleted is a 409 ``input_file_missing`` or ``error_file_missing``).
The retry takes no parameters; a body with any field is a 400 naming it.

Idempotent: a batch retried before answers the retry batch it already has (the oldest
batch of the owner's whose ``metadata.batchpipe_retry_of`` is its id, found in the state
topic's records, read to the topic's end first), with ``already_retried: true``; nothing
new is created. On one replica the check and the create hold one lock, so two retries at
once make one batch; two replicas retrying the same batch at the same instant can both
miss the other's and make two (later retries answer the oldest).
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from batchpipe.api.batches import MAX_METADATA_PAIRS, create_from, mine, render
from batchpipe.api.context import Services, owner, services
from batchpipe.api.errors import ApiError, bad_request
from batchpipe.api.files import store_file
from batchpipe.api.records import BatchRecord
from batchpipe.api.retention import ANCHOR, expired
from worker.errors import ErrorCode

router = APIRouter()

RETRY_OF = "batchpipe_retry_of"
_WHY: dict[int, str] = {
    ErrorCode.MALFORMED: "malformed input: it would fail the same way again",
    ErrorCode.INVALID_PARAMETER: "an invalid parameter: it would fail the same way again",
    ErrorCode.OVER_LIMIT: "over a limit: it would fail the same way again",
    ErrorCode.DEADLINE_EXCEEDED: "its deadline passed before it ran",
    ErrorCode.BATCH_CANCELLED: "its batch was cancelled",
    ErrorCode.BATCH_EXPIRED: "its batch expired before it ran",
    ErrorCode.BATCH_CAP_REACHED: "its batch reached its token or cost cap before it ran",
}


#: a retry's check for an earlier retry batch and its create, together (on this replica)
_CHECK_AND_CREATE = threading.Lock()
_GONE = {"input": "its lines cannot be run again", "error": "its failed lines are not known"}


def _read(svc: Services, batch: BatchRecord, file_id: str, which: str) -> bytes:
    """The bytes of the batch's ``which`` (input, error) file; a 409 naming it when it
    expired or was deleted."""
    record = svc.state.file(file_id)
    try:
        if record is None or expired(record):
            raise FileNotFoundError(file_id)
        with svc.store.local_copy(file_id) as path:
            return path.read_bytes()
    except FileNotFoundError as exc:
        raise ApiError(
            409, f"the {which} file {file_id} of batch {batch.id} is gone (expired or "
            f"deleted), so {_GONE[which]}",
            param="batch_id", code=f"{which}_file_missing",
        ) from exc  # fmt: skip


def _errors(svc: Services, batch: BatchRecord) -> Iterator[dict[str, Any]]:
    if batch.error_file_id is None:
        return
    for line in _read(svc, batch, batch.error_file_id, "error").splitlines():
        if line.strip():
            yield json.loads(line)


def _why_not(code: str) -> str | None:
    """None for an engine failure (retried); else why the line is not retried."""
    number = int(code) if code.isdigit() else 0
    if 5000 <= number < 6000:
        return None
    return _WHY.get(number, f"error {code} is not an engine failure")


def split(svc: Services, batch: BatchRecord) -> tuple[set[str], list[dict[str, str]]]:
    """The custom_ids to retry, and the other error lines with why they are not."""
    retry: set[str] = set()
    kept: list[dict[str, str]] = []
    for line in _errors(svc, batch):
        custom_id, code = str(line.get("custom_id")), str((line.get("error") or {}).get("code"))
        why = _why_not(code)
        if why is None:
            retry.add(custom_id)
        else:
            kept.append({"custom_id": custom_id, "code": code, "reason": why})
    return retry, kept


def _lines(source: bytes, custom_ids: set[str]) -> bytes:
    chosen = [
        line
        for line in source.splitlines(keepends=True)
        if line.strip() and json.loads(line).get("custom_id") in custom_ids
    ]
    return b"".join(chosen)


def earlier(svc: Services, batch: BatchRecord) -> BatchRecord | None:
    """The retry batch ``batch`` already has (the oldest, if a race made several), after
    reading the state topic to its end: it may be another replica's."""
    svc.state.sync()
    found = [b for b in svc.state.batches(batch.owner) if b.metadata.get(RETRY_OF) == batch.id]
    return found[-1] if found else None  # batches() is newest first


def _retry(svc: Services, batch: BatchRecord, who: str) -> dict[str, Any]:
    if not batch.terminal:
        raise ApiError(
            409, f"batch {batch.id} is {batch.status}; retry it once it has ended",
            param="batch_id", code="batch_not_ended",
        )  # fmt: skip
    retry, kept = split(svc, batch)
    answer: dict[str, Any] = {"object": "batchpipe.retry", "retry_of": batch.id, "batch": None,
                              "retried": len(retry), "not_retried": kept,
                              "already_retried": False}  # fmt: skip
    if not retry:
        return answer
    with _CHECK_AND_CREATE:
        found = earlier(svc, batch)
        if found is not None:
            return answer | {"batch": render(svc, found), "already_retried": True}
        answer["batch"] = render(svc, _create(svc, batch, retry, who))
    return answer


def _create(svc: Services, batch: BatchRecord, retry: set[str], who: str) -> BatchRecord:
    chosen = _lines(_read(svc, batch, batch.input_file_id, "input"), retry)
    name = f"retry-of-{batch.id}.jsonl"
    file = store_file(svc, io.BytesIO(chosen), name, who, batch.output_expires_after)
    others = [(k, v) for k, v in batch.metadata.items() if k != RETRY_OF]
    metadata = dict([*others[: MAX_METADATA_PAIRS - 1], (RETRY_OF, batch.id)])
    body: dict[str, Any] = {
        "input_file_id": file.id,
        "endpoint": batch.endpoint,
        "completion_window": batch.completion_window,
        "metadata": metadata,
    }
    if batch.output_expires_after is not None:
        body["output_expires_after"] = {"anchor": ANCHOR, "seconds": batch.output_expires_after}
    return create_from(svc, body, who)


def _no_parameters(raw: bytes) -> None:
    """A retry takes no parameters: a body, if any, is an empty JSON object; anything
    else is a 400 naming the first field (never ignored)."""
    if not raw.strip():
        return
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise bad_request("the body is not JSON; a retry takes no parameters") from exc
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object; a retry takes no parameters")
    if body:
        field = sorted(body)[0]
        raise bad_request(f"{field}: unknown parameter; a retry takes no parameters", field)


@router.post("/v1/batches/{batch_id}/retry")
async def retry_batch(batch_id: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    _no_parameters(await request.body())
    # in a worker thread: it reads files and waits on Kafka
    answer = await run_in_threadpool(lambda: _retry(svc, mine(svc, batch_id, who), who))
    if answer["batch"] is not None and not answer["already_retried"]:
        svc.metrics.batch_created()
    return answer
