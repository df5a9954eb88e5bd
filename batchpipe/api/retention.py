"""When files expire, and the sweep that removes them once they have.

OpenAI's policies (``openai.types.file_create_params.ExpiresAfter`` and
``batch_create_params.OutputExpiresAfter``): ``{"anchor": "created_at", "seconds": N}``
with N from 3600 (1 hour) to 2,592,000 (30 days), counted from the file's own
``created_at`` — for a batch's output and error files, when they were written, not when
the batch was created. ``expires_after`` on an upload sets its file's ``expires_at``;
``output_expires_after`` on a batch sets its output and error files'. Without a policy a
file expires ``api.file_expires_after_s`` after it was created (30 days, as OpenAI's
batch files; 0 keeps files until they are deleted).

An expired file is gone for its owner at once — absent from the list, 404 for retrieve,
content and delete, and no batch can be created from it — and :class:`Retention` removes
its bytes from the store and its record from the state topic on the lifecycle's next
sweep; a batch's output or error file takes the batch's answer log with it
(:mod:`batchpipe.api.answerlog`). The input file of a batch that has not ended is the one
exception: the batch needs it to publish its requests and to answer the ones no worker
answered, so its bytes stay (hidden from the owner) until the batch ends. A batch never
breaks because its input file expired or was deleted: the batch record stands on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from batchpipe.api.answerlog import forget
from batchpipe.api.errors import bad_request
from batchpipe.api.records import FileRecord, output_batch_id
from batchpipe.api.state import StateTopic
from batchpipe.api.store import FileStore
from worker.config import ApiConfig

log = logging.getLogger("batchpipe.api")

MIN_EXPIRES_AFTER_S = 3600
MAX_EXPIRES_AFTER_S = 30 * 24 * 3600
ANCHOR = "created_at"
SWEEP_INTERVAL_S = 1.0


def now() -> float:
    """The clock every expiry decision reads (one place, so a test can move it)."""
    return time.time()


def expires_after(value: object, field: str) -> int:
    """The seconds of an ``{"anchor": "created_at", "seconds": N}`` policy; a 400 naming
    the field (``field.anchor``, ``field.seconds``) for anything else."""
    if not isinstance(value, Mapping):
        raise bad_request(
            f'{field}: must be an object {{"anchor": "created_at", "seconds": N}}', field
        )
    unknown = sorted(set(value) - {"anchor", "seconds"})
    if unknown:
        raise bad_request(f"{field}.{unknown[0]}: unknown parameter", f"{field}.{unknown[0]}")
    anchor, seconds = value.get("anchor"), value.get("seconds")
    if anchor != ANCHOR:
        raise bad_request(
            f"{field}.anchor: {anchor!r}; the only anchor is 'created_at'", f"{field}.anchor"
        )
    if (
        not isinstance(seconds, int)
        or isinstance(seconds, bool)
        or not MIN_EXPIRES_AFTER_S <= seconds <= MAX_EXPIRES_AFTER_S
    ):
        raise bad_request(
            f"{field}.seconds: {seconds!r}; an integer from {MIN_EXPIRES_AFTER_S} (1 hour) to "
            f"{MAX_EXPIRES_AFTER_S} (30 days)",
            f"{field}.seconds",
        )
    return seconds


def form_expires_after(form: Mapping[str, object]) -> int | None:
    """``expires_after`` of a multipart upload, as the SDK sends it
    (``expires_after[anchor]``, ``expires_after[seconds]``); None when absent."""
    parts = {
        name: form[f"expires_after[{name}]"]
        for name in ("anchor", "seconds")
        if f"expires_after[{name}]" in form
    }
    if not parts:
        return None
    seconds = parts.get("seconds")
    if isinstance(seconds, str) and seconds.strip().isdigit():
        parts["seconds"] = int(seconds)
    return expires_after(parts, "expires_after")


def expiry(created_at: int, seconds: int | None, api: ApiConfig) -> int | None:
    """``expires_at`` of a file created at ``created_at`` under a policy of ``seconds``
    (None: the server's default)."""
    window = api.file_expires_after_s if seconds is None else seconds
    return created_at + window if window > 0 else None


def expired(file: FileRecord, at: float | None = None) -> bool:
    return file.expires_at is not None and file.expires_at <= (now() if at is None else at)


class Retention:
    """Removes expired files: bytes first, then the record (a failure in between leaves
    a record whose expiry hides it, removed on the next sweep). Every replica sweeps;
    removing twice is harmless."""

    def __init__(self, state: StateTopic, store: FileStore, answers: Path) -> None:
        self._state = state
        self._store = store
        self._answers = answers  # every replica's answer logs, a directory each
        self._last = 0.0

    def step(self, at: float) -> None:
        """Sweep, at most once a :data:`SWEEP_INTERVAL_S`."""
        if at - self._last < SWEEP_INTERVAL_S:
            return
        self._last = at
        try:
            self.sweep(at)
        except Exception as exc:  # Kafka or any store's failure: the next sweep retries
            log.warning("removing expired files failed, retrying: %r", exc)

    def sweep(self, at: float) -> list[str]:
        """Remove every file expired at ``at`` that no unfinished batch reads; their ids."""
        removed: list[str] = []
        in_use = self._in_use()
        for file in self._state.files():
            if not expired(file, at) or file.id in in_use:
                continue
            # under the file's lock: a batch created from it now is either seen here or
            # refused there (it checks expiry under the same lock)
            with self._state.guard(file.id):
                if self._state.file(file.id) is None or file.id in self._in_use():
                    continue
                self._store.delete(file.id)
                self._state.delete_file(file)
                if file.purpose == "batch_output":
                    forget(self._answers, output_batch_id(file.id))
            removed.append(file.id)
        if removed:
            log.info("removed %d expired files", len(removed))
        return removed

    def _in_use(self) -> set[str]:
        """The input files of the batches that have not ended."""
        return {b.input_file_id for b in self._state.batches() if not b.terminal}
