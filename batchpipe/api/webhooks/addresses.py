"""The outbound-address guard: where a webhook may be sent.

A webhook URL is the key owner's to choose, so without a guard the server would POST
wherever a tenant points it — its own loopback services, the cloud's metadata endpoint
(169.254.169.254), the private network behind it. :meth:`AddressGuard.check` resolves
the host once and refuses the URL unless **every** address it resolves to is public
(:func:`worker.outbound.blocked_reason`, the remote engine's rule) or inside a network
of ``api.webhook_allow_networks`` — a list of networks rather than the engine's one
switch, so a test or a same-host receiver opens 127.0.0.1/32 and nothing else. The sender
then connects to the address that was checked, never resolving again (a name that
resolves to a public address for the check and a private one for the connection cannot
slip through), and every redirect's target goes through the same check before anything
is sent to it. A refusal happens before any connection is opened.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from worker.config import ConfigError
from worker.outbound import OutboundRefused, blocked_reason

#: host, port -> the addresses it resolves to (socket.getaddrinfo; fakes in tests)
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Unlike :func:`worker.outbound.resolve`, a name that does not resolve now is an
    ``OSError``: a failed attempt, retried, not a refusal."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (``address``) and what to call it (``host``)."""

    scheme: str
    host: str
    port: int
    path: str  # with the query
    address: str

    @property
    def pinned_url(self) -> str:
        ip = ipaddress.ip_address(self.address)
        shown = f"[{ip}]" if ip.version == 6 else str(ip)
        return f"{self.scheme}://{shown}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        default = {"http": 80, "https": 443}[self.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return host if self.port == default else f"{host}:{self.port}"


def _networks(allowed: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    found = []
    for cidr in allowed:
        try:
            found.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError as exc:
            raise ConfigError(f"api.webhook_allow_networks: {cidr!r}: {exc}") from exc
    return found


class AddressGuard:
    def __init__(self, allowed: Iterable[str] = (), resolver: Resolver = system_resolver) -> None:
        self._allowed = _networks(allowed)
        self._resolve = resolver

    def _refusal(self, address: str) -> str | None:
        """Why ``address`` may not be sent to; None when it may."""
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self._allowed):
            return None
        return blocked_reason(address)

    def check(self, url: str) -> Target:
        """The target to connect to; ``OutboundRefused`` for a URL that may not be sent
        to, ``OSError`` when its name does not resolve now (worth retrying)."""
        scheme, host, port, path = url_parts(url)
        addresses = self._resolve(host, port)
        if not addresses:
            raise OSError(f"{host} resolves to no address")
        for address in addresses:
            reason = self._refusal(address)
            if reason is not None:
                raise OutboundRefused(
                    f"{host} resolves to {address}, a {reason} address, not a "
                    "public one; api.webhook_allow_networks may allow it"
                )
        return Target(scheme, host, port, path, addresses[0].split("%")[0])

    def check_literal(self, url: str) -> None:
        """Refuse now a URL whose host is an address that :meth:`check` would refuse at
        every attempt (a name is checked at each attempt only: what it resolves to
        may change)."""
        _, host, _, _ = url_parts(url)
        try:
            address = str(ipaddress.ip_address(host))
        except ValueError:
            return
        reason = self._refusal(address)
        if reason is not None:
            raise OutboundRefused(
                f"{address} is a {reason} address, not a public one; "
                "api.webhook_allow_networks may allow it"
            )


def url_parts(url: str) -> tuple[str, str, int, str]:
    """``(scheme, host, port, path with query)`` of a URL a webhook may be sent to;
    :class:`OutboundRefused`, saying why, for any other: a scheme other than http(s), no
    host, a user or password, a bad port, a fragment, spaces or control characters,
    characters that are not ASCII (percent-encoded in a path, punycode in a name). The
    message never repeats the URL (it may hold a password)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # its message holds no part of the URL
        raise OutboundRefused(f"not a URL: {exc}") from exc
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("a webhook URL carries no user or password")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused("not an http or https URL with a host")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise OutboundRefused("spaces or control characters in the URL")
    if not url.isascii():
        raise OutboundRefused(
            "characters that are not ASCII in the URL: percent-encode them, and write "
            "a name as punycode (xn--...)"
        )
    if parts.fragment:
        raise OutboundRefused("a fragment (#...) in the URL, which would never be sent")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path
