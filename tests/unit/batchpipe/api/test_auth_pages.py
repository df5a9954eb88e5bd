"""API keys, owners and --no-auth; cursor pagination."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from batchpipe.api.auth import LOCAL_OWNER, load_keys
from batchpipe.api.errors import ApiError
from batchpipe.api.pages import page
from worker.config import ApiConfig, ConfigError


def test_keys_from_file_and_env_map_to_owners(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# team keys\nalice: sk-a\nsk-bare\n")
    keys = load_keys(
        ApiConfig(keys_file=str(keys_file)),
        no_auth=False,
        environ={"BATCHPIPE_API_KEYS": "bob:sk-b"},
    )
    assert keys.owner("Bearer sk-a") == "alice"
    assert keys.owner("Bearer sk-b") == "bob"
    assert keys.owner("bearer sk-bare").startswith("key-")
    assert "sk-" not in repr(keys)
    with pytest.raises(ApiError) as missing:
        keys.owner(None)
    assert missing.value.status == 401
    with pytest.raises(ApiError) as wrong:
        keys.owner("Bearer sk-nope")
    assert (wrong.value.status, wrong.value.error_code) == (401, "invalid_api_key")


def test_no_keys_or_no_auth_off_loopback_refuse_to_start() -> None:
    with pytest.raises(ConfigError, match="no API keys"):
        load_keys(ApiConfig(), no_auth=False, environ={})
    with pytest.raises(ConfigError, match=r"only for 127\.0\.0\.1"):
        load_keys(ApiConfig(host="0.0.0.0"), no_auth=True, environ={})
    assert load_keys(ApiConfig(), no_auth=True).owner(None) == LOCAL_OWNER


@dataclass(frozen=True)
class Item:
    id: str


def test_pages_follow_after_and_refuse_an_unknown_cursor() -> None:
    items = [Item(f"b{i}") for i in range(5)]
    first = page(items, None, 2, lambda i: {"id": i.id})
    assert (first["first_id"], first["last_id"], first["has_more"]) == ("b0", "b1", True)
    last = page(items, "b3", 2, lambda i: {"id": i.id})
    assert ([d["id"] for d in last["data"]], last["has_more"]) == (["b4"], False)
    with pytest.raises(ApiError) as bad:
        page(items, "nope", 2, lambda i: {"id": i.id})
    assert (bad.value.status, bad.value.param) == (400, "after")
