"""Reading and validating a batch of requests before anything is published.

A batch is all or nothing: every line is checked — syntax and values through
:func:`worker.wire.batchline.parse_line`, plus the file-level rules of Alibaba Bailian
(line count, file and line size, unique ``custom_id``, one model per file) — and a
single bad line rejects the whole batch with a :class:`BatchFileError` that names
the bad lines (the first :data:`MAX_LISTED_PROBLEMS`, and how many more); reading
stops at the first line past ``max_lines``. Files are validated in one streaming pass that
keeps only the ``custom_id`` set, then read again to publish, so a 500 MB file is never
held in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from worker.errors import BatchpipeError, ErrorCode, RequestError
from worker.wire.batchline import parse_line
from worker.wire.messages import InferenceRequest
from worker.wire.validation import validate_request

_CHUNK = 1 << 20
#: problems a BatchFileError lists; past that it counts them (a file of 2M bad lines
#: must not become a 100 MB message)
MAX_LISTED_PROBLEMS = 100


@dataclass(frozen=True)
class FileLimits:
    """Limits on a batch file (lines, bytes, models); the defaults are Alibaba Bailian's."""

    max_lines: int = 50_000
    max_file_bytes: int = 500 * 1024 * 1024
    max_line_bytes: int = 6 * 1024 * 1024
    one_model: bool = True


DEFAULT_LIMITS = FileLimits()


@dataclass(frozen=True)
class FileScan:
    """What validating a file found: its requests, their kinds (``chat``,
    ``completions``), the model of its first request and every model it names (one,
    unless :attr:`FileLimits.one_model` is off)."""

    total: int
    endpoints: frozenset[str]
    model: str
    models: frozenset[str]


class LineProblem(NamedTuple):
    """One rejected line: its 1-based number (0 for the file as a whole), code, reason."""

    line_no: int
    code: int
    message: str


class BatchFileError(BatchpipeError, ValueError):
    """The batch has invalid lines; nothing was published."""

    def __init__(self, source: str, problems: Iterable[LineProblem], unlisted: int = 0) -> None:
        self.source = source
        self.problems: tuple[LineProblem, ...] = tuple(problems)
        self.unlisted = unlisted  # problems found past the listed ones
        lines = [
            f"  {'file' if p.line_no == 0 else f'line {p.line_no}'}: {p.code} {p.message}"
            for p in self.problems
        ]
        if unlisted:
            lines.append(f"  and {unlisted} more not listed")
        count = len(self.problems) + unlisted
        super().__init__(
            f"{source}: {count} problem{'s' if count != 1 else ''}, nothing was published\n"
            + "\n".join(lines)
        )


class _Checker:
    """Accumulates the problems of a batch, one item at a time."""

    def __init__(self, limits: FileLimits) -> None:
        self.limits = limits
        self.problems: list[LineProblem] = []
        self.unlisted = 0
        self.count = 0
        self._seen: set[str] = set()
        self._model: tuple[int, str] | None = None  # (first line, model name)
        self.endpoints: set[str] = set()
        self.models: set[str] = set()

    def reject(self, line_no: int, code: int, message: str) -> None:
        if len(self.problems) < MAX_LISTED_PROBLEMS:
            self.problems.append(LineProblem(line_no, code, message))
        else:
            self.unlisted += 1

    @property
    def over_limit(self) -> bool:
        """More items than ``max_lines``: the batch is refused, reading on is wasted."""
        return self.count > self.limits.max_lines

    def oversize(self, line_no: int, size: int) -> None:
        self.count += 1
        self.reject(
            line_no,
            ErrorCode.OVER_LIMIT,
            f"{size} bytes, over the {self.limits.max_line_bytes} bytes limit of a line",
        )

    def check(
        self, line_no: int, item: bytes | Mapping[str, Any] | InferenceRequest
    ) -> InferenceRequest | None:
        """Parse and check one item; the request, or None when the item itself is bad."""
        self.count += 1
        if self.count == self.limits.max_lines + 1:
            self.reject(
                line_no,
                ErrorCode.OVER_LIMIT,
                f"more than {self.limits.max_lines} requests in one batch",
            )
        try:
            if isinstance(item, InferenceRequest):
                validate_request(item)
                req = item
            else:
                req = parse_line(item)
        except RequestError as exc:
            self.reject(line_no, int(exc.code), exc.message)
            return None
        if req.custom_id in self._seen:
            self.reject(line_no, ErrorCode.MALFORMED, f"duplicate custom_id {req.custom_id!r}")
        self._seen.add(req.custom_id)
        self.endpoints.add(req.endpoint)
        self.models.add(req.model)
        if self._model is None:
            self._model = (line_no, req.model)
        elif self.limits.one_model and req.model != self._model[1]:
            first_line, first_model = self._model
            self.reject(
                line_no,
                ErrorCode.INVALID_PARAMETER,
                f"model {req.model!r} differs from {first_model!r} (line {first_line}); "
                "a batch uses one model, as OpenAI's Batch API requires",
            )
        return req

    def finish(self, source: str) -> FileScan:
        if self.count == 0:
            self.reject(0, ErrorCode.MALFORMED, "the batch holds no requests")
        if self.problems:
            raise BatchFileError(source, self.problems, self.unlisted)
        model = self._model[1] if self._model else ""
        return FileScan(self.count, frozenset(self.endpoints), model, frozenset(self.models))


def _lines(stream: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """Yield ``(line_no, content, size)`` for non-blank lines; content is None when oversize.

    Reads at most ``max_line_bytes`` of a line into memory; the rest of an oversize
    line is skipped in chunks.
    """
    line_no = 0
    while True:
        raw = stream.readline(max_line_bytes + 3)  # room for "\r\n" and one byte over
        if not raw:
            return
        line_no += 1
        size = len(raw)
        while not raw.endswith(b"\n") and size > max_line_bytes:
            chunk = stream.readline(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            raw = chunk[-2:]
        content = raw.rstrip(b"\r\n")
        size -= len(raw) - len(content)
        if size > max_line_bytes:
            yield line_no, None, size
        elif content.strip():
            yield line_no, content, size


def validate_file(path: str | os.PathLike[str], limits: FileLimits = DEFAULT_LIMITS) -> int:
    """Check every line of a JSONL batch file; return its number of requests.

    Raises :class:`BatchFileError` listing every problem, or :class:`OSError`.
    """
    return scan_file(path, limits).total


def scan_file(path: str | os.PathLike[str], limits: FileLimits = DEFAULT_LIMITS) -> FileScan:
    """:func:`validate_file`, telling also the kinds of request and the model."""
    file = Path(path)
    size = file.stat().st_size
    if size > limits.max_file_bytes:
        raise BatchFileError(
            str(file),
            [
                LineProblem(
                    0, ErrorCode.OVER_LIMIT, f"{size} bytes, over the {limits.max_file_bytes} limit"
                )
            ],
        )
    checker = _Checker(limits)
    with file.open("rb") as stream:
        for line_no, content, line_size in _lines(stream, limits.max_line_bytes):
            if content is None:
                checker.oversize(line_no, line_size)
            else:
                checker.check(line_no, content)
            if checker.over_limit:
                break
    return checker.finish(str(file))


def iter_file(
    path: str | os.PathLike[str], limits: FileLimits = DEFAULT_LIMITS
) -> Iterator[InferenceRequest]:
    """The requests of a file that :func:`validate_file` accepted, parsed again, in order.

    A file that changed in between raises :class:`BatchFileError` at the changed line.
    """
    with Path(path).open("rb") as stream:
        for line_no, content, line_size in _lines(stream, limits.max_line_bytes):
            if content is None:
                raise BatchFileError(
                    str(path), [LineProblem(line_no, ErrorCode.OVER_LIMIT, f"{line_size} bytes")]
                )
            try:
                yield parse_line(content)
            except RequestError as exc:
                raise BatchFileError(
                    str(path), [LineProblem(line_no, int(exc.code), exc.message)]
                ) from exc


def validate_requests(
    items: Iterable[InferenceRequest | Mapping[str, Any]], limits: FileLimits = DEFAULT_LIMITS
) -> list[InferenceRequest]:
    """Check in-memory requests (dataclasses or batch-line mappings) by the same rules.

    Item numbers in problems are 1-based, like file lines. A mapping's size is that
    of its compact JSON form.
    """
    checker = _Checker(limits)
    requests: list[InferenceRequest] = []
    for number, item in enumerate(items, start=1):
        if not isinstance(item, InferenceRequest):
            size = len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode())
            if size > limits.max_line_bytes:
                checker.oversize(number, size)
                continue
        req = checker.check(number, item)
        if req is not None:
            requests.append(req)
        if checker.over_limit:
            break
    checker.finish("requests")
    return requests
