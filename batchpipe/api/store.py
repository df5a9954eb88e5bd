"""Where file bytes live: the :class:`FileStore` contract and the local directory store.

The API streams an upload into a staging file on local disk (:meth:`FileStore.staging`),
validates it there, then :meth:`~FileStore.put` makes it a stored object — or deletes
it, so a refused file is never stored. Names are the API's file ids. The records that
say which files exist, and whose they are, live on the Kafka state topic
(:mod:`batchpipe.api.state`); the store only holds bytes.

``api.store: local`` (default) is a directory (``api.store_dir``): what ``make demo`` and
the tests use, and enough for one replica or several sharing a volume.
``api.store: s3`` is :class:`batchpipe.api.s3store.S3Store`; :func:`batchpipe.api.app.open_store`
opens the one ``api.store`` names.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

CHUNK_BYTES = 1 << 20


class FileStore(ABC):
    """Bytes by name; every method may raise ``OSError`` (or the backend's error)."""

    def __init__(self, staging_dir: Path) -> None:
        self._staging_dir = staging_dir
        staging_dir.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A new local path to write an upload to; removed on exit unless it was put."""
        path = self._staging_dir / f"upload-{secrets.token_hex(8)}"
        try:
            yield path
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @abstractmethod
    def put(self, name: str, source: Path) -> None:
        """Store the local file ``source`` as ``name`` (``source`` may be moved)."""

    @abstractmethod
    def chunks(self, name: str) -> Iterator[bytes]:
        """The bytes of ``name``, streamed; ``FileNotFoundError`` when there is none."""

    @abstractmethod
    @contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        """A local path holding ``name``'s bytes, for as long as the context lasts."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove ``name``; nothing happens when it does not exist."""

    @abstractmethod
    def check(self) -> None:
        """Raise when the store cannot be used (readiness)."""


class LocalStore(FileStore):
    """Objects as files under ``root/objects``, staged under ``root/staging``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "staging")
        self._objects = root / "objects"
        self._objects.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise FileNotFoundError(name)
        return self._objects / name

    def put(self, name: str, source: Path) -> None:
        os.replace(source, self._path(name))  # atomic: readers see all of it or nothing

    def chunks(self, name: str) -> Iterator[bytes]:
        stream = self._path(name).open("rb")  # raises here, before a response starts
        return _read(stream)

    @contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        path = self._path(name)
        if not path.exists():
            raise FileNotFoundError(name)
        yield path

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def check(self) -> None:
        if not os.access(self._objects, os.W_OK):
            raise OSError(f"{self._objects} is not writable")


def _read(stream: BinaryIO) -> Iterator[bytes]:
    with stream:
        while chunk := stream.read(CHUNK_BYTES):
            yield chunk
