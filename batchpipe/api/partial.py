"""``GET /v1/batches/{batch_id}/partial``: a batch's answered lines while it runs.

An extension route (OpenAI hands results over only at the end). The body is JSON Lines:
the batch's output lines (``"error": null``) and error lines (``"error": {...}``) answered
so far, byte for byte as its output and error files will hold them, in the order of its
answer log (:mod:`batchpipe.api.answerlog`) — the order those files keep. ``after`` is a
cursor this route gave (``X-Batchpipe-Cursor``; none: from the first line) and ``limit``
the most lines a page holds (1 to :data:`MAX_LIMIT`, default :data:`DEFAULT_LIMIT`; a page
also stops after :data:`MAX_PAGE_BYTES` once it holds a line). ``last=N`` (instead of
``after``) gives the latest N lines answered, what the console shows of a running batch,
found by reading the log backwards in chunks. Reading again from the
cursor gives only what was answered since, so the pages read one after the other are a
growing prefix of the batch's lines, each line once, and the final files are the last
page plus the rest. Headers say what a reader needs next:

* ``X-Batchpipe-Cursor``: the cursor after this page's last line;
* ``X-Batchpipe-Has-More``: ``true`` when more lines are answered already (read again now);
* ``X-Batchpipe-Batch-Status``: the batch's status, read before the page;
* ``X-Batchpipe-Done``: ``true`` when the batch has ended and this page reached the end
  of its lines: nothing more will come.

Nothing here touches Kafka or the batch: a page is a byte range of a local file, found
by reading at most ``limit`` lines and streamed in chunks, so memory stays bounded
whatever the batch's size. A cursor that is not one this route could have given (not a
number, past the lines answered, inside a line) is a 400 naming ``after``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from batchpipe.api.answerlog import answers_dir, log_path
from batchpipe.api.batches import mine
from batchpipe.api.context import owner, services
from batchpipe.api.errors import ApiError, bad_request
from batchpipe.api.store import CHUNK_BYTES

router = APIRouter()

DEFAULT_LIMIT = 1_000
MAX_LIMIT = 10_000
MAX_PAGE_BYTES = 32 * 1024 * 1024
_MAX_CURSOR_CHARS = 20


@dataclass(frozen=True)
class Page:
    """Bytes ``start`` to ``end`` of a log: ``lines`` whole lines."""

    start: int
    end: int
    lines: int
    has_more: bool  # more whole lines follow ``end`` already


def cursor(after: str | None) -> int:
    """The byte offset a cursor names (0 for none); a 400 naming ``after`` otherwise."""
    if after is None or after == "":
        return 0
    if len(after) > _MAX_CURSOR_CHARS or not (after.isascii() and after.isdigit()):
        raise bad_request(f"after: {after[:40]!r} is not a cursor this route gave", "after")
    return int(after)


def page_of(log: BinaryIO, size: int, start: int, limit: int, max_bytes: int) -> Page:
    """The page of at most ``limit`` whole lines (and ``max_bytes`` once it holds one)
    from ``start`` of ``log``, whose length is ``size``; a 400 when ``start`` is no line's
    start. A last line without its newline is still being written: it is left out."""
    if start > size:
        raise bad_request(f"after: {start} is past the lines answered ({size})", "after")
    if start > 0:
        log.seek(start - 1)
        if log.read(1) != b"\n":
            raise bad_request(f"after: {start} is not at the start of a line", "after")
    log.seek(start)
    end, lines = start, 0
    while True:
        line = log.readline()
        if not line.endswith(b"\n"):  # the end, or a line still being written
            return Page(start, end, lines, has_more=False)
        if lines == limit or (lines > 0 and end + len(line) - start > max_bytes):
            return Page(start, end, lines, has_more=True)
        end += len(line)
        lines += 1


def tail_of(log: BinaryIO, size: int, last: int) -> Page:
    """The page of the last ``last`` whole lines of ``log`` (whose length is ``size``),
    found by reading back from its end a chunk at a time."""
    end = start = 0
    newlines = 0  # seen from the end, the one that ends the last whole line included
    at = size
    while at > 0:
        step = min(CHUNK_BYTES, at)
        at -= step
        log.seek(at)
        chunk = log.read(step)
        index = len(chunk)
        while (index := chunk.rfind(b"\n", 0, index)) >= 0:
            if newlines == 0:
                end = at + index + 1  # after it: a line still being written
            newlines += 1
            if newlines > last:
                start = at + index + 1
                return Page(start, end, last, has_more=False)
    return Page(0, end, newlines, has_more=False)


def _range(log: BinaryIO, page: Page) -> Iterator[bytes]:
    with log:
        log.seek(page.start)
        left = page.end - page.start
        while left > 0:
            chunk = log.read(min(CHUNK_BYTES, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


def _no_log(batch_id: str) -> ApiError:
    return ApiError(
        409,
        f"batch {batch_id} ended before its answers were logged on this server; "
        "read its output and error files",
        param="batch_id",
        code="partial_unavailable",
    )


@router.get("/v1/batches/{batch_id}/partial")
def partial(
    batch_id: str,
    request: Request,
    who: str = Depends(owner),
    after: str | None = None,
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT),
    last: int | None = Query(None, ge=1, le=MAX_LIMIT),
) -> StreamingResponse:
    svc = services(request)
    start = cursor(after)
    if last is not None and after is not None:
        raise bad_request("last: the latest lines or the lines after a cursor, not both", "last")
    batch = mine(svc, batch_id, who)  # read before the page: "ended" then means all logged
    path: Path = log_path(answers_dir(svc.config.api), batch.id)
    try:
        log = path.open("rb")
    except FileNotFoundError:
        if batch.terminal and (batch.output_file_id or batch.error_file_id):
            raise _no_log(batch.id) from None
        if start > 0:
            raise bad_request(f"after: {start} is past the lines answered (0)", "after") from None
        found = Page(0, 0, 0, has_more=False)
        return _response(iter(()), found, batch.status, batch.terminal)
    try:
        size = path.stat().st_size
        if last is None:
            found = page_of(log, size, start, limit, MAX_PAGE_BYTES)
        else:
            found = tail_of(log, size, last)
    except BaseException:
        log.close()
        raise
    done = batch.terminal and not found.has_more
    return _response(_range(log, found), found, batch.status, done)


def _response(body: Iterator[bytes], page: Page, status: str, done: bool) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="application/jsonl",
        headers={
            "X-Batchpipe-Cursor": str(page.end),
            "X-Batchpipe-Has-More": str(page.has_more).lower(),
            "X-Batchpipe-Batch-Status": status,
            "X-Batchpipe-Done": str(done).lower(),
            "X-Batchpipe-Lines": str(page.lines),
        },
    )
