"""One attempt to deliver a webhook: a POST to the checked address, bounded in time.

Each hop is checked by the :class:`~.addresses.AddressGuard` first and sent to the
address it checked (``Host``, and the TLS name its certificate is verified for, as in
the URL); a redirect (301, 302, 303, 307,
308) is followed at most :data:`MAX_REDIRECTS` times, re-sending the same POST, and
only once its target passed the guard. Connecting, and each read and write, waits at
most ``api.webhook_timeout_s``. Any 2xx is delivered; anything else is a failed attempt
(retried later), except a refusal by the guard, which no retry can change.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urljoin

import httpx

from batchpipe.api.webhooks.addresses import AddressGuard
from worker.outbound import OutboundRefused as Refused

MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class Outcome:
    kind: Literal["delivered", "failed", "refused"]
    detail: str  # for the log: a status, an error's name; never a header or the body


class Sender:
    def __init__(
        self, guard: AddressGuard, timeout_s: float, verify: ssl.SSLContext | bool = True
    ) -> None:
        """``verify``: the certificates a receiver's TLS is checked against (httpx's
        default, certifi's CAs; the tests' own CA)."""
        self._guard = guard
        # no kept-alive connections: one is pinned to an address and verified for one
        # name, and must never carry another name's delivery (webhooks are few)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,
            verify=verify,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        self._client.close()

    def send(self, url: str, headers: Mapping[str, str], body: bytes) -> Outcome:
        for _ in range(MAX_REDIRECTS + 1):
            try:
                target = self._guard.check(url)
            except Refused as exc:
                return Outcome("refused", str(exc))
            except OSError as exc:
                return Outcome("failed", f"cannot resolve: {exc}")
            extensions: dict[str, Any] = (
                {"sni_hostname": target.host} if target.scheme == "https" else {}
            )
            try:
                response = self._client.post(
                    target.pinned_url,
                    headers={**headers, "host": target.host_header},
                    content=body,
                    extensions=extensions,
                )
            except httpx.HTTPError as exc:
                return Outcome("failed", type(exc).__name__)
            if 200 <= response.status_code < 300:
                return Outcome("delivered", str(response.status_code))
            location = response.headers.get("location")
            if response.status_code not in _REDIRECTS or not location:
                return Outcome("failed", f"HTTP {response.status_code}")
            url = urljoin(url, location)
        return Outcome("failed", f"more than {MAX_REDIRECTS} redirects")
