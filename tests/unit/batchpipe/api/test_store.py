"""The local file store: staged uploads become objects atomically; refused ones vanish."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchpipe.api.store import LocalStore


def test_put_read_delete_and_staging_cleanup(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with store.staging() as staged:
        staged.write_bytes(b"a" * 3_000_000)
        store.put("file-1", staged)
    with store.staging() as refused:
        refused.write_bytes(b"bad")
    assert list((tmp_path / "staging").iterdir()) == []
    assert b"".join(store.chunks("file-1")) == b"a" * 3_000_000
    with store.local_copy("file-1") as path:
        assert path.stat().st_size == 3_000_000
    store.delete("file-1")
    store.delete("file-1")  # nothing to delete is fine
    with pytest.raises(FileNotFoundError):
        store.chunks("file-1")
    with pytest.raises(FileNotFoundError):
        store.chunks("../escape")
