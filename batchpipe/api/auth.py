"""API keys and whose objects a request may see.

Keys come from ``api.keys_file`` (one per line: ``owner: key``, or a bare key; ``#``
starts a comment) and from the ``BATCHPIPE_API_KEYS`` environment variable
(comma-separated, same forms). A key is never logged or stored: records carry its
*owner*, the name given in the file or, for a bare key, ``key-`` and the first 12 hex
digits of its SHA-256. Each owner sees only its own files and batches; another owner's id
is answered 404, exactly as an id that does not exist. Without keys the server refuses to
start unless ``--no-auth`` on a loopback address, where every request is owner ``local``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from batchpipe.api.errors import ApiError
from worker.config import API_KEYS_ENV, ApiConfig, ConfigError

LOCAL_OWNER = "local"


def _owner_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _parse(entries: Iterable[str], origin: str) -> dict[str, str]:
    """``{key: owner}`` from ``owner: key`` or bare-key entries."""
    keys: dict[str, str] = {}
    for number, raw in enumerate(entries, start=1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        owner, sep, key = entry.rpartition(":")
        owner, key = owner.strip(), key.strip()
        if not key or (sep and not owner):
            raise ConfigError(f"{origin} entry {number}: expected 'owner: key' or a key")
        keys[key] = owner or _owner_of(key)
    return keys


@dataclass(frozen=True)
class Keys:
    """The accepted keys (``{key: owner}``); ``open`` means --no-auth."""

    by_key: Mapping[str, str]
    open: bool = False

    def __repr__(self) -> str:  # never print a key, whatever prints this object
        return f"Keys({len(self.by_key)} keys, open={self.open})"

    def owner(self, authorization: str | None) -> str:
        """The owner of an ``Authorization: Bearer KEY`` header; :class:`ApiError` 401."""
        if self.open:
            return LOCAL_OWNER
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. Send it in the Authorization header: "
                "'Authorization: Bearer YOUR_KEY'.",
            )
        key = key.strip()
        for known, owner in self.by_key.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                return owner
        raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")


def load_keys(api: ApiConfig, *, no_auth: bool, environ: Mapping[str, str] | None = None) -> Keys:
    """The keys ``batchpipe serve`` accepts; :class:`ConfigError` when it must not start."""
    if no_auth:
        if not _loopback(api.host):
            raise ConfigError(
                f"--no-auth: refused on api.host {api.host!r}; it is only for 127.0.0.1 "
                "(or ::1, localhost), where nobody else can reach the server"
            )
        return Keys({}, open=True)
    env = os.environ if environ is None else environ
    keys: dict[str, str] = {}
    if api.keys_file:
        try:
            text = Path(api.keys_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"api.keys_file: cannot read {api.keys_file}: {exc.strerror}"
            ) from exc
        keys |= _parse(text.splitlines(), f"api.keys_file {api.keys_file}")
    keys |= _parse(env.get(API_KEYS_ENV, "").split(","), API_KEYS_ENV)
    if not keys:
        raise ConfigError(
            f"no API keys: set api.keys_file or {API_KEYS_ENV}, or run with --no-auth on "
            "127.0.0.1 for local use"
        )
    return Keys(keys)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
