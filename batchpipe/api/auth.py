"""API keys and whose objects a request may see.

Keys come from ``api.keys_file`` and from the ``BATCHPIPE_API_KEYS`` environment
variable (comma-separated entries). An entry is ``owner: key`` in the file (a space after
the colon), ``owner:key`` or ``owner: key`` in the variable, or a bare key; a line of the
file that starts with ``#`` is a comment. A key is exactly what the operator wrote: every
character but the surrounding spaces, ``#`` included. An entry that could be read two
ways — a file line ``A:B`` (a bare key, or owner ``A``?), a key with spaces inside (a
comment after it?), an owner that is not a plain name — refuses the start, naming the
entry, rather than be read one way silently. A key is never logged or stored: records carry its
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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from batchpipe.api.errors import ApiError
from worker.config import API_KEYS_ENV, ApiConfig, ConfigError

LOCAL_OWNER = "local"


def _owner_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


_OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def _entry(entry: str, *, spaced: bool) -> tuple[str, str]:
    """``(owner, key)`` of one entry (owner "" for a bare key); ``ValueError`` says why
    it cannot be read one way only. ``spaced``: ``owner: key`` needs the space."""
    owner, sep, key = entry.partition(":")
    if sep and spaced and not key[:1].isspace():
        raise ValueError(
            "write 'owner: key' with a space after the colon; a bare key cannot hold ':'"
        )
    if not sep:
        owner, key = "", entry
    owner, key = owner.strip(), key.strip()
    if sep and not _OWNER.fullmatch(owner):
        raise ValueError(f"owner {owner!r} is not a name of letters, digits and ._@-")
    if not key:
        raise ValueError("no key")
    if any(c.isspace() for c in key):
        raise ValueError("a key holds no spaces (comments go on lines of their own)")
    return owner, key


def _parse(entries: Iterable[str], origin: str, *, spaced: bool) -> dict[str, str]:
    """``{key: owner}`` from ``owner: key`` or bare-key entries."""
    keys: dict[str, str] = {}
    what = "line" if spaced else "entry"
    for number, raw in enumerate(entries, start=1):
        entry = raw.strip()
        if not entry or (spaced and entry.startswith("#")):
            continue
        try:
            owner, key = _entry(entry, spaced=spaced)
        except ValueError as exc:
            raise ConfigError(f"{origin} {what} {number}: {exc}; nothing was loaded") from exc
        if key in keys:
            raise ConfigError(f"{origin} {what} {number}: the same key is given twice")
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
        if not is_loopback(api.host):
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
        keys |= _parse(text.splitlines(), f"api.keys_file {api.keys_file}", spaced=True)
    keys |= _parse(env.get(API_KEYS_ENV, "").split(","), API_KEYS_ENV, spaced=False)
    if not keys:
        raise ConfigError(
            f"no API keys: set api.keys_file or {API_KEYS_ENV}, or run with --no-auth on "
            "127.0.0.1 for local use"
        )
    return Keys(keys)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
