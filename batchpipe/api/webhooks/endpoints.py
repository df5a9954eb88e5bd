"""Each API key's webhook endpoint (``api.webhooks``): its URL, the events it wants, and
its signing secret, read from an environment variable or a file at start.

A secret is never in the configuration file itself, and never printed: an
:class:`Endpoint`'s ``repr`` leaves it out, and nothing logs, exposes on ``/metrics`` or
shows in the console anything but the owner and the URL's host.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.signing import secret_key
from worker.config import ApiConfig, ConfigError
from worker.outbound import OutboundRefused

#: the events a webhook may carry: a batch's ends, as OpenAI names them
EVENTS: tuple[str, ...] = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


@dataclass(frozen=True)
class Endpoint:
    owner: str
    url: str
    events: frozenset[str]
    key: bytes = field(repr=False)  # the HMAC key (signing.secret_key)


def _key(owner: str, spec: Mapping[str, Any], environ: Mapping[str, str]) -> bytes:
    where = f"api.webhooks.{owner}"
    env, path = spec.get("secret_env"), spec.get("secret_file")
    if (env is None) == (path is None):
        raise ConfigError(f"{where}: give exactly one of secret_env and secret_file")
    if env is not None:
        if str(env) not in environ:
            raise ConfigError(f"{where}.secret_env: the environment variable {env} is not set")
        secret = environ[str(env)]
        origin = f"environment variable {env}"
    else:
        try:
            secret = Path(str(path)).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{where}.secret_file: cannot read {path}: {exc.strerror}") from exc
        origin = f"file {path}"
    secret = secret.strip()
    if not secret:
        raise ConfigError(f"{where}: the secret ({origin}) is empty")
    try:
        return secret_key(secret)
    except ValueError as exc:
        raise ConfigError(f"{where}: the secret ({origin}) is not usable: {exc}") from exc


def load_endpoints(
    api: ApiConfig, owners: Collection[str], environ: Mapping[str, str] | None = None
) -> dict[str, Endpoint]:
    """``{owner: Endpoint}``; :class:`ConfigError` names the entry that cannot be used —
    an unusable secret, or an owner no API key has (``owners``), whose endpoint would
    never be called."""
    env = os.environ if environ is None else environ
    guard = AddressGuard(api.webhook_allow_networks)
    found: dict[str, Endpoint] = {}
    for owner, spec in api.webhooks.items():
        if owner not in owners:
            raise ConfigError(
                f"api.webhooks.{owner}: no API key has owner {owner!r} "
                f"(owners: {', '.join(sorted(owners))})"
            )
        url = str(spec["url"])
        try:
            guard.check_literal(url)  # and the URL's form (url_parts)
        except OutboundRefused as exc:
            raise ConfigError(f"api.webhooks.{owner}.url: {exc}") from exc
        events = frozenset(spec.get("events") or EVENTS)
        found[owner] = Endpoint(owner, url, events, _key(owner, spec, env))
    return found
