"""A batch's answers in the one order its partial reads and its final files share.

The results topic holds a batch's answers on every partition, and two reads of it
interleave the partitions differently; so the order of a batch's lines is not the topic's
but the order in which this replica's :class:`~batchpipe.api.follow.ResultsFollower`
first read them. It appends each new answer (one per ``custom_id``, the first read wins,
as :class:`~batchpipe.collect.BatchTally` counts) to the batch's answer log, a local file
of OpenAI batch output and error lines exactly as the final files hold them
(:func:`~batchpipe.collect.result_line`). ``GET /v1/batches/{id}/partial``
(:mod:`batchpipe.api.partial`) serves byte ranges of it while the batch runs, and when it
ends :mod:`batchpipe.api.assemble` appends the rest and splits the log, line by line and
in its order, into the output and error files: so every partial read is a prefix of
them, and the final files are the last partial read plus the rest.

A restart keeps the log (it lies under ``api.store_dir``): the follower reads the batch's
results again and appends only the ``custom_id``s the log does not hold yet, so what a
reader was given stays where it was. The log is appended in whole lines at the end of
every read of the topic; a line torn by a crash is cut off when the log is opened again.
Each replica keeps its own log (a directory per host name): a reader's cursor is valid
on the replica that gave it.
"""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import BinaryIO

from batchpipe.collect import BatchTally, result_line
from worker.config import ApiConfig
from worker.wire.messages import InferenceResult

_HELD_LINES = 1_000  # the most lines a log holds before it appends them


def answers_root(api: ApiConfig) -> Path:
    """Where every replica sharing ``api.store_dir`` keeps its answer logs."""
    return Path(api.store_dir).expanduser() / "answers"


def answers_dir(api: ApiConfig) -> Path:
    """Where this replica keeps its answer logs."""
    return answers_root(api) / socket.gethostname()


def log_path(directory: Path, batch_id: str) -> Path:
    return directory / f"{batch_id}.jsonl"


def is_error_line(line: bytes) -> bool:
    """An error file's line (``error`` set) rather than an output file's."""
    return json.loads(line).get("error") is not None


def _logged(path: Path) -> set[str]:
    """The ``custom_id``s the log holds; a torn last line (a crash mid-write) is cut off."""
    ids: set[str] = set()
    if not path.exists():
        return ids
    whole = 0  # bytes up to the end of the last whole line
    with path.open("rb") as log:
        for line in log:
            if not line.endswith(b"\n"):
                break
            ids.add(json.loads(line)["custom_id"])
            whole += len(line)
    if whole < path.stat().st_size:
        with path.open("r+b") as log:
            log.truncate(whole)
    return ids


class AnswerLog:
    """One batch's tally and answer log, written by the follower's thread only.

    No file stays open: the lines of one read step are held and appended at its end in
    one write (a server with thousands of running batches holds no descriptor for each),
    or sooner once :data:`_HELD_LINES` are held (an assembly reading a long remainder)."""

    def __init__(self, directory: Path, batch_id: str, total: int) -> None:
        self.tally = BatchTally(batch_id, total)
        self.path = log_path(directory, batch_id)
        directory.mkdir(parents=True, exist_ok=True)
        # after a restart, the answers logged before it: counted again, never logged twice
        self._earlier = _logged(self.path)
        self.path.touch()  # a batch with no answer yet has a log: an empty one
        self._held: list[str] = []

    def add(self, result: InferenceResult) -> bool:
        """Count ``result`` and log it; False for another batch's or a repeat."""
        if not self.tally.add(result):
            return False
        self.append(result)
        return True

    def append(self, result: InferenceResult) -> None:
        """Log ``result``, which the tally has just counted."""
        if result.custom_id not in self._earlier:
            self._held.append(result_line(result))
            if len(self._held) >= _HELD_LINES:
                self.flush()

    def flush(self) -> None:
        """Append the lines held: what partial reads may serve from now on."""
        if self._held:
            with self.path.open("a", encoding="utf-8") as log:
                log.write("".join(self._held))
            self._held.clear()

    def split(self, output: BinaryIO, errors: BinaryIO) -> None:
        """Copy the log's lines, in order, to ``output`` and (error lines) ``errors``."""
        self.flush()
        with self.path.open("rb") as log:
            for line in log:
                (errors if is_error_line(line) else output).write(line)


def forget(root: Path, batch_id: str) -> None:
    """Remove a batch's answer logs, every replica's under ``root`` (its output files
    have expired): a replica that is gone, or came back under another host name, leaves
    none behind on a shared volume."""
    for path in root.glob(f"*/{log_path(Path(), batch_id)}"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
