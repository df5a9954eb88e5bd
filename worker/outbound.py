"""Where batchpipe may send HTTP requests of its own: the outbound address guard.

A remote engine's ``base_url`` (and a webhook's URL) is text someone typed. Sent blindly,
it can reach what only the worker's own network can: the cloud's metadata service on
169.254.169.254, a database on 10.0.0.5, an admin port on 127.0.0.1. So a URL is
checked before anything is sent to it, on the addresses its host name *resolves to*
(a name that resolves to a private address is refused like the address itself):

* loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10), private
  (10/8, 172.16/12, 192.168/16, fc00::/7), shared (100.64/10), unspecified, multicast and
  reserved addresses are refused unless the operator allows them (``allow_private``);
* an IPv4 address written inside IPv6 (``::ffff:10.0.0.1``) counts as the IPv4 address;
* only ``http`` and ``https`` are accepted, with a host.

Redirects are never followed by the callers, so a public server cannot bounce a request
onto a private address after the check.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from worker.errors import BatchpipeError

Resolver = Callable[[str, int], Sequence[str]]


class OutboundRefused(BatchpipeError, ValueError):
    """The URL may not be sent to; the message names the URL's host and why."""


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system's resolver)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OutboundRefused(f"{host!r} does not resolve: {exc}") from exc
    return [str(info[4][0]) for info in infos]


def blocked_reason(address: str) -> str | None:
    """Why ``address`` is not public ("loopback", "private", …); None for a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    checks = (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("shared (carrier-grade NAT)", ip in ipaddress.ip_network("100.64.0.0/10")),
        ("reserved", ip.is_reserved or not ip.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def check_url(url: str, *, allow_private: bool, setting: str, resolver: Resolver = resolve) -> None:
    """Refuse ``url`` (``setting`` names where it came from) unless every address its host
    resolves to is public, or ``allow_private``. Raises :class:`OutboundRefused`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused(f"{setting}: {url!r} is not an http(s) URL with a host")
    if allow_private:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for address in resolver(parts.hostname, port):
        reason = blocked_reason(address)
        if reason is not None:
            raise OutboundRefused(
                f"{setting}: {parts.hostname!r} is {address}, a {reason} address; outbound "
                "requests go to public addresses only unless allowed "
                f"({setting.rsplit('.', 1)[0]}.allow_private: true)"
            )
