"""How a ``batchpipe`` command ends: its exit code and its one line on stderr."""

from __future__ import annotations

import sys

from batchpipe.client import CollectTimeoutError
from worker.errors import BatchpipeError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130
#: ``batchpipe run`` stopped the batch at its cap: every line answered, those not run 4008
EXIT_CAPPED = 5


def exit_code(exc: BatchpipeError) -> int:
    """Bad input (the project's ``ValueError`` kinds: :class:`~worker.config.ConfigError`,
    :class:`~batchpipe.batchfile.BatchFileError`; nothing was published) is 2, a
    ``collect`` timeout 124, anything else 1."""
    if isinstance(exc, ValueError):
        return EXIT_USAGE
    if isinstance(exc, CollectTimeoutError):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def report(message: str, code: int | None = None) -> None:
    prefix = "batchpipe:" if code is None else f"batchpipe: error {code}:"
    print(f"{prefix} {message}", file=sys.stderr)
