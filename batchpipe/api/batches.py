"""``/v1/batches``: create, retrieve, list (newest first) and cancel batches. A batch is
created from an uploaded file of the caller's (purpose ``batch``) for one of the
endpoints batchpipe serves, with ``completion_window`` ``24h`` and at most 16
``metadata`` pairs (keys up to 64 characters, values up to 512), as OpenAI takes them. It
starts ``validating``; :mod:`batchpipe.api.lifecycle` takes it from there. When the
server routes models (``kafka.routes``), a file whose model has no route is refused with
400 naming the model: no worker group would ever answer it; so is a file whose model no
live worker announces while others do (:mod:`batchpipe.fleet`), naming the models served.
Every field of a wrong type is a 400 naming it; the body must be ``application/json``
(415) and at most :data:`~batchpipe.api.guard.MAX_JSON_BYTES` (413), and a body nested
too deeply to parse is a 400. The batch is written under its input file's lock
(:meth:`StateTopic.guard`), so a concurrent deletion of the file either comes first (404)
or sees the batch (409), and so does the sweep of an expired file. Its token and cost caps
are read from ``metadata`` and its key's defaults (:mod:`batchpipe.api.costcap`).
``output_expires_after`` sets how long its output and error files live
(:mod:`batchpipe.api.retention`); an expired input file is a 404, as a deleted one.

Cancel: ``validating`` and ``in_progress`` become ``cancelling``; ``cancelling`` answers
the batch as it is (a retried cancel is safe); a batch that is finalizing or has ended is
a 409 — decided under the lifecycle's lock, so a batch cannot end and be cancelled too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from batchpipe.api.context import Services, owner, services
from batchpipe.api.costcap import CapError, batch_cap
from batchpipe.api.errors import ApiError, bad_request, not_found
from batchpipe.api.guard import require_json
from batchpipe.api.pages import page
from batchpipe.api.quota import enqueued, file_tokens, over_limit, token_limit
from batchpipe.api.records import ENDPOINTS, BatchRecord, Counts
from batchpipe.api.retention import expired, expires_after
from batchpipe.api.tiers import TIER_METADATA, batch_tier
from batchpipe.api.weights import WEIGHT_METADATA, batch_weight
from batchpipe.collect import new_batch_id
from batchpipe.fleet import not_served
from worker.routing import UnroutedModelError

router = APIRouter()

COMPLETION_WINDOWS_S: Mapping[str, int] = {"24h": 24 * 3600}
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("metadata: must be an object of strings", "metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata: at most {MAX_METADATA_PAIRS} pairs", "metadata")
    for key, item in value.items():  # JSON keys are strings
        if not isinstance(item, str) or len(key) > MAX_METADATA_KEY:
            raise bad_request(
                f"metadata: keys are strings of at most {MAX_METADATA_KEY} characters and "
                f"values strings of at most {MAX_METADATA_VALUE}",
                "metadata",
            )
        if len(item) > MAX_METADATA_VALUE:
            raise bad_request(f"metadata.{key}: over {MAX_METADATA_VALUE} characters", "metadata")
    return dict(value)


def render(svc: Services, batch: BatchRecord) -> dict[str, Any]:
    counts, usage = svc.lifecycle.progress(batch)
    return batch.to_openai(counts, usage)


def create_from(svc: Services, body: Mapping[str, Any], who: str) -> BatchRecord:
    """A new batch from a create request's body (``POST /v1/batches``, and a retry's)."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad_request(f"{unknown[0]}: unknown parameter", unknown[0])
    output_expires_after = (
        None
        if body.get("output_expires_after") is None
        else expires_after(body["output_expires_after"], "output_expires_after")
    )
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise bad_request(
            f"endpoint: {endpoint!r} is not served here; use one of {sorted(ENDPOINTS)}",
            "endpoint",
        )
    window = body.get("completion_window")
    if not isinstance(window, str) or window not in COMPLETION_WINDOWS_S:
        raise bad_request(
            f"completion_window: {window!r}; only '24h' is supported", "completion_window"
        )
    metadata = _metadata(body.get("metadata"))
    try:
        batch_weight(svc.config, who, metadata)
    except ValueError as exc:
        raise bad_request(str(exc), f"metadata.{WEIGHT_METADATA}") from exc
    try:
        batch_tier(svc.config, who, metadata)
    except ValueError as exc:
        raise bad_request(str(exc), f"metadata.{TIER_METADATA}") from exc
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise bad_request("input_file_id: required, a file id (a string)", "input_file_id")
    with svc.state.guard(file_id):
        batch = _batch_of(svc, file_id, who, endpoint, window, metadata, output_expires_after)
    if not batch.terminal:
        svc.lifecycle.created(batch)
    return batch


def _batch_of(
    svc: Services,
    file_id: str,
    who: str,
    endpoint: str,
    window: str,
    metadata: dict[str, str],
    output_expires_after: int | None,
) -> BatchRecord:
    file = svc.state.file(file_id)
    if file is None or file.owner != who or expired(file):
        raise not_found("file", file_id, "input_file_id")
    if file.purpose != "batch":
        raise bad_request(
            f"input_file_id: {file_id} has purpose {file.purpose!r}, not 'batch'",
            "input_file_id",
        )
    try:
        svc.routing.topic_for(file.model)
    except UnroutedModelError as exc:
        raise bad_request(str(exc), "input_file_id", "model_not_found") from exc
    if svc.fleet is not None:
        refused = not_served([file.model], svc.fleet.served())
        if refused is not None:  # no worker would answer it: every line would fail
            raise bad_request(refused, "input_file_id", "model_not_found")
    try:
        cap = batch_cap(svc.config, who, file.model, metadata)
    except CapError as exc:
        raise bad_request(str(exc), exc.param, exc.error_code) from exc
    created = time.time()
    tokens, refusal = _token_check(svc, file_id, who)
    batch = BatchRecord(
        id=new_batch_id(created),
        owner=who,
        input_file_id=file_id,
        endpoint=endpoint,
        completion_window=window,
        created_at=int(created),
        expires_at=int(created) + COMPLETION_WINDOWS_S[window],
        metadata=metadata,
        model=file.model,
        output_expires_after=output_expires_after,
        counts=Counts(total=file.lines),
        tokens=tokens,
        cap=cap,
    )
    if refusal is not None:  # recorded as failed, never published
        batch = replace(batch, status="failed", failed_at=int(created), errors=(refusal,))
    return svc.state.put_batch(batch)


def _token_check(svc: Services, file_id: str, who: str) -> tuple[int, dict[str, object] | None]:
    """The batch's estimated tokens (for its key's limit and the per-key series of
    /metrics), and the error that refuses it when it would pass its key's limit."""
    with svc.store.local_copy(file_id) as path:
        tokens = file_tokens(path, svc.limits, svc.config.generation.max_tokens)
    limit = token_limit(svc.config, who)
    if limit is None:
        return tokens, None
    queued = enqueued(svc.state.batches(), who, lambda b: svc.lifecycle.progress(b)[0])
    if queued + tokens > limit:
        return tokens, over_limit(limit, queued, tokens)
    return tokens, None


@router.post("/v1/batches")
async def create_batch(request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    require_json(request)
    try:
        body = await request.json()
    except ValueError as exc:
        raise bad_request(f"the body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise bad_request("the body is nested too deeply to be a batch request") from exc
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    # in a worker thread: it waits on Kafka and on locks Kafka writes hold
    batch = await run_in_threadpool(create_from, svc, body, who)
    svc.metrics.batch_created()
    return render(svc, batch)


def mine(svc: Services, batch_id: str, who: str) -> BatchRecord:
    batch = svc.state.batch(batch_id)
    if batch is None or batch.owner != who:
        raise not_found("batch", batch_id, "batch_id")
    return batch


@router.get("/v1/batches")
def list_batches(
    request: Request,
    who: str = Depends(owner),
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
) -> dict[str, Any]:
    svc = services(request)
    return page(svc.state.batches(who), after, limit, lambda b: render(svc, b))


@router.get("/v1/batches/{batch_id}")
def retrieve_batch(batch_id: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    return render(svc, mine(svc, batch_id, who))


@router.post("/v1/batches/{batch_id}/cancel")
def cancel_batch(batch_id: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    batch, cancelled = svc.lifecycle.cancel(mine(svc, batch_id, who).id)
    if not cancelled:
        raise ApiError(
            409,
            f"Cannot cancel a batch with status {batch.status!r}.",
            param="batch_id",
            code="batch_not_cancellable",
        )
    return render(svc, batch)
