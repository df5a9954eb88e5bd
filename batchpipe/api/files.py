"""``/v1/files``: upload, list, retrieve, download and delete files.

An upload (``multipart/form-data`` with ``file`` and ``purpose=batch``) is streamed to a
staging file — the framework spools the part to disk, never the whole body in memory,
and :mod:`.guard` counts the body's bytes as they arrive — and validated exactly as
``batchpipe submit`` validates a file (:func:`batchpipe.batchfile.scan_file`). A file
with any bad line is refused naming its bad lines (the first
:data:`~batchpipe.batchfile.MAX_LISTED_PROBLEMS`, and how many more; ``code``
``invalid_file``) and nothing is stored. A file is deleted only while no batch that has
not ended reads it, checked and written under the file's lock (:meth:`StateTopic.guard`),
which creating a batch from it holds too. Files the server produces (a batch's output
and error files) have purpose ``batch_output`` and can be downloaded, not uploaded.
``expires_after`` (as the SDK sends it: ``expires_after[anchor]``,
``expires_after[seconds]``) sets ``expires_at``; an expired file is absent from the list
and a 404 everywhere else (:mod:`batchpipe.api.retention`). Any other form field is a
400 naming it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, BinaryIO, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from batchpipe.api.context import Services, owner, services
from batchpipe.api.errors import ApiError, bad_request, not_found
from batchpipe.api.guard import FRAMING_BYTES
from batchpipe.api.pages import page
from batchpipe.api.records import FileRecord, new_file_id
from batchpipe.api.retention import expired, expiry, form_expires_after
from batchpipe.api.state import KafkaUnavailable
from batchpipe.batchfile import BatchFileError, FileLimits, scan_file

router = APIRouter()

#: the parts of an upload; expires_after as the SDK sends it (retention.form_expires_after)
_FORM_FIELDS = {"file", "purpose", "expires_after[anchor]", "expires_after[seconds]"}


def _too_large(limits: FileLimits, size: int | str) -> ApiError:
    return ApiError(
        413,
        f"file of {size} bytes is over the limit of {limits.max_file_bytes} bytes",
        param="file",
        code="file_too_large",
    )


def _copy(source: BinaryIO, target: Path, limits: FileLimits) -> int:
    """Copy the spooled upload to ``target``; refuse it once it passes the size limit."""
    size = 0
    with target.open("wb") as out:
        while chunk := source.read(1 << 20):
            size += len(chunk)
            if size > limits.max_file_bytes:
                raise _too_large(limits, f"more than {limits.max_file_bytes}")
            out.write(chunk)
    return size


def store_file(
    svc: Services, source: BinaryIO, filename: str, who: str, expires_after: int | None
) -> FileRecord:
    """Validate an input file (an upload; a retry's lines, :mod:`batchpipe.api.retry`)
    and store it; nothing is stored when it is refused."""
    limits = svc.limits
    with svc.store.staging() as staged:
        size = _copy(source, staged, limits)
        try:
            scan = scan_file(staged, limits)
        except BatchFileError as exc:
            problems = "; ".join(
                f"{'file' if p.line_no == 0 else f'line {p.line_no}'}: {p.code} {p.message}"
                for p in exc.problems
            )
            count = len(exc.problems) + exc.unlisted
            more = f"; and {exc.unlisted} more not listed" if exc.unlisted else ""
            raise bad_request(
                f"{filename}: {count} "
                f"problem{'s' if count != 1 else ''}, nothing was stored: {problems}{more}",
                param="file",
                code="invalid_file",
            ) from exc
        created = int(time.time())
        record = FileRecord(
            id=new_file_id(),
            owner=who,
            filename=filename,
            size=size,
            created_at=created,
            purpose="batch",
            lines=scan.total,
            endpoints=tuple(sorted(scan.endpoints)),
            model=scan.model,
            expires_at=expiry(created, expires_after, svc.config.api),
        )
        svc.store.put(record.id, staged)
    try:
        svc.state.put_file(record)
    except BaseException:
        svc.store.delete(record.id)  # an object without its record would never be found
        raise
    return record


@router.post("/v1/files")
async def create_file(request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    if not svc.state.reachable:  # before reading an upload that could not be recorded
        raise KafkaUnavailable("Kafka is unreachable; nothing was stored, retry later")
    limits = svc.limits
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_file_bytes + FRAMING_BYTES:
        raise _too_large(limits, declared)
    try:
        form = await request.form(max_files=1, max_fields=4)
    except ApiError:  # the body passed its limit while streaming (.guard)
        raise
    except Exception as exc:  # the framework's multipart errors have no common base
        raise bad_request(f"the body is not multipart/form-data: {exc}") from exc
    try:
        unknown = sorted(set(form.keys()) - _FORM_FIELDS)
        if unknown:
            raise bad_request(f"{unknown[0]}: unknown parameter", unknown[0])
        expires_after = form_expires_after(form)
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise bad_request(
                f"purpose: {purpose!r} is not supported; batchpipe stores files for "
                "purpose 'batch' only",
                param="purpose",
            )
        if not isinstance(upload, UploadFile):
            raise bad_request("file: a multipart file part named 'file' is required", "file")
        name = upload.filename or "upload.jsonl"
        record = await run_in_threadpool(store_file, svc, upload.file, name, who, expires_after)
    finally:
        await form.close()
    svc.metrics.uploaded(record.size)
    return record.to_openai()


def _mine(svc: Services, file_id: str, who: str) -> FileRecord:
    record = svc.state.file(file_id)
    if record is None or record.owner != who or expired(record):
        raise not_found("file", file_id, "file_id")
    return record


@router.get("/v1/files")
def list_files(
    request: Request,
    who: str = Depends(owner),
    purpose: str | None = None,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    limit: int = Query(10_000, ge=1, le=10_000),
) -> dict[str, Any]:
    records = [
        f
        for f in services(request).state.files(who)
        if purpose in (None, f.purpose) and not expired(f)
    ]
    if order == "asc":
        records.reverse()
    return page(records, after, limit, FileRecord.to_openai)


@router.get("/v1/files/{file_id}")
def retrieve_file(file_id: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    return _mine(services(request), file_id, who).to_openai()


@router.get("/v1/files/{file_id}/content")
def file_content(file_id: str, request: Request, who: str = Depends(owner)) -> StreamingResponse:
    svc = services(request)
    record = _mine(svc, file_id, who)
    try:
        chunks = svc.store.chunks(record.id)
    except FileNotFoundError as exc:
        raise not_found("file content", file_id, "file_id") from exc
    return StreamingResponse(chunks, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}")
def delete_file(file_id: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    svc = services(request)
    with svc.state.guard(file_id):
        record = _mine(svc, file_id, who)
        users = [
            b.id for b in svc.state.batches(who) if b.input_file_id == file_id and not b.terminal
        ]
        if users:
            raise ApiError(
                409,
                f"file {file_id} is the input of batch {users[0]}, which has not ended; "
                "cancel it or wait for it to end",
                param="file_id",
                code="file_in_use",
            )
        svc.state.delete_file(record)
    svc.store.delete(record.id)
    return {"id": file_id, "object": "file", "deleted": True}
