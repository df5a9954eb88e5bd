"""What ``serve`` checks in a batch's lines before publishing them, beyond what the upload
validated: each line addresses the batch's endpoint, and no line's ``priority`` is above
the key's cap (``api.max_priority``).

Why the cap: a worker orders the requests it holds by ``priority`` before anything else,
and with fair share (docs/architecture.md §10) its window holds several keys' requests, so
an uncapped priority would let one key's lines run ahead of another key's share. Under the
cap (default 0) priority orders a tenant's own work only: a key may rank its lines below
others (negative priorities), not above. A line over the cap fails the whole batch, naming
``priority`` and the cap, rather than being lowered silently.
"""

from __future__ import annotations

from pathlib import Path

from batchpipe.api.records import ENDPOINTS
from batchpipe.batchfile import FileLimits, iter_file
from worker.errors import ErrorCode

MAX_ERRORS = 100  # lines named in a failed batch's errors.data


def line_problems(
    path: Path, endpoint: str, limits: FileLimits, max_priority: int
) -> list[dict[str, object]]:
    """``errors.data`` entries for the first :data:`MAX_ERRORS` lines that may not run."""
    kind = ENDPOINTS[endpoint]
    errors: list[dict[str, object]] = []
    for line, req in enumerate(iter_file(path, limits), start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if req.endpoint != kind:
            errors.append(
                _error(
                    line, "url", f"the line addresses another endpoint than the batch's {endpoint}"
                )
            )
        elif req.priority > max_priority:
            errors.append(
                _error(
                    line,
                    "priority",
                    f"priority {req.priority} is above this key's cap api.max_priority "
                    f"({max_priority})",
                )
            )
    return errors


def _error(line: int, param: str, message: str) -> dict[str, object]:
    return {
        "code": str(int(ErrorCode.INVALID_PARAMETER)),
        "message": message,
        "param": param,
        "line": line,
    }
