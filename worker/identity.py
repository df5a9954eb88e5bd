"""A worker's stable identity, which names its transactional producer.

Exactly-once needs a ``transactional.id`` that survives a restart: the restarted
instance's ``init_transactions`` then fences its predecessor and aborts the transaction
it left open, which would otherwise hold back every ``read_committed`` reader of the
results topic until it timed out. A configured ``worker.worker_id`` is used as is (a
StatefulSet pod name is ideal). Otherwise the id is the host name plus the lowest free
*slot* on this host, held by an exclusive file lock for the life of the process: a worker
restarted after a crash takes its slot back, and two workers on one host get two slots.
"""

from __future__ import annotations

import fcntl
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_MAX_SLOTS = 1024


@dataclass(frozen=True)
class WorkerIdentity:
    worker_id: str
    lock: IO[bytes] | None  # kept open: closing it (or dying) frees the slot


def claim(group_id: str, configured: str = "", lock_dir: Path | None = None) -> WorkerIdentity:
    if configured:
        return WorkerIdentity(configured, None)
    host = socket.gethostname()
    directory = lock_dir or Path(tempfile.gettempdir()) / "batchpipe-slots"
    directory.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", f"{group_id}-{host}")
    for slot in range(_MAX_SLOTS):
        handle = open(directory / f"{safe}-{slot}.lock", "ab")  # noqa: SIM115 — held open
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return WorkerIdentity(f"{host}-{slot}", handle)
    raise RuntimeError(f"more than {_MAX_SLOTS} workers of group {group_id!r} on {host}")


def release(identity: WorkerIdentity) -> None:
    if identity.lock is not None:
        identity.lock.close()
