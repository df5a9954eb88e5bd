"""One attempt to deliver a webhook: a POST to the checked address, bounded in time.

Each hop is checked by the :class:`~.addresses.AddressGuard` first and sent to the
address it checked (``Host``, and the TLS name its certificate is verified for, as in
the URL); a redirect (301, 302, 303, 307, 308) is followed at most
:data:`MAX_REDIRECTS` times, re-sending the same POST, and only once its target passed
the guard.

A receiver is a stranger's server, so nothing it does may hold a sender thread for long
or fill the memory:

* the whole attempt — resolving each hop's name (:func:`_within`), every connect, TLS
  handshake, write and read of every hop — ends ``api.webhook_timeout_s`` after it
  began (:class:`_Deadline`: each socket operation may wait only for what is left, and
  the TLS handshake counts as one), so an answer dripped a byte at a time fails at the
  deadline like a silent one;
* only the status line and headers are read (at most h11's 100 KiB); the body of the
  answer never is, and the connection is closed after it.

Any 2xx is delivered; anything else is a failed attempt (retried later). A refusal by
the guard of the configured URL itself is final (no retry can change it); a redirect to a
refused target is a failed attempt, since the receiver may answer otherwise next time.
Nothing is ever sent to a refused address.
"""

from __future__ import annotations

import queue
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urldefrag, urljoin

import certifi
import httpcore

from batchpipe.api.webhooks.addresses import AddressGuard, Target
from worker.outbound import OutboundRefused as Refused

MAX_REDIRECTS = 3
USER_AGENT = "batchpipe-webhooks/1 (Standard Webhooks)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: what a receiver can do to an attempt: fail to connect, break TLS or HTTP, be too slow
_FAILURES = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    ssl.SSLError,
    OSError,
)


@dataclass(frozen=True)
class Outcome:
    kind: Literal["delivered", "failed", "refused"]
    detail: str  # for the log: a status, an error's name; never a header or the body


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most until the attempt's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        # one handshake is one wait: the ssl module bounds it as a whole by the timeout
        left = self._deadline.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, left), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Deadline(httpcore.NetworkBackend):
    """The network of one attempt: connections that end at ``at`` (time.monotonic())."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._backend = httpcore.SyncBackend()

    def left(self, timeout: float | None, expired: type[Exception]) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired("the attempt's deadline (api.webhook_timeout_s) passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = self.left(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("webhooks go over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _within(deadline: _Deadline, check: Callable[[str], Target], url: str) -> Target:
    """``check(url)`` — resolving the URL's name — within the attempt's deadline: the
    system's resolver has no timeout of its own to give, so it runs in a thread of its
    own, left to finish alone when the deadline passes (``TimeoutError``, an ``OSError``:
    a failed attempt)."""
    found: queue.Queue[Target | BaseException] = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            found.put(check(url))
        except BaseException as exc:  # handed to the attempt, raised there
            found.put(exc)

    threading.Thread(target=run, name="api-webhook-resolve", daemon=True).start()
    try:
        answer = found.get(timeout=max(deadline.at - time.monotonic(), 0.0))
    except queue.Empty:
        raise TimeoutError("resolving the name took longer than the attempt's deadline") from None
    if isinstance(answer, BaseException):
        raise answer
    return answer


class Sender:
    def __init__(
        self, guard: AddressGuard, timeout_s: float, verify: ssl.SSLContext | None = None
    ) -> None:
        """``verify``: the certificates a receiver's TLS is checked against (by default
        certifi's CAs, as httpx and the SDK; the tests' own CA)."""
        self._guard = guard
        self._timeout_s = timeout_s
        self._ssl = verify or ssl.create_default_context(cafile=certifi.where())

    def close(self) -> None:
        """Nothing is held between attempts (no kept-alive connection: one is pinned to
        an address and verified for one name, and must never carry another name's
        delivery)."""

    def send(self, url: str, headers: Mapping[str, str], body: bytes) -> Outcome:
        deadline = _Deadline(time.monotonic() + self._timeout_s)
        with httpcore.ConnectionPool(
            ssl_context=self._ssl, max_keepalive_connections=0, network_backend=deadline
        ) as pool:
            for hop in range(MAX_REDIRECTS + 1):
                try:
                    target = _within(deadline, self._guard.check, url)
                except Refused as exc:
                    return Outcome("refused" if hop == 0 else "failed", str(exc))
                except OSError as exc:
                    return Outcome("failed", f"cannot resolve: {exc}")
                try:
                    status, location = self._post(pool, target, headers, body)
                except _FAILURES as exc:
                    late = time.monotonic() >= deadline.at
                    why = f"no answer within {self._timeout_s:g}s" if late else type(exc).__name__
                    return Outcome("failed", why)
                if 200 <= status < 300:
                    return Outcome("delivered", str(status))
                if status not in _REDIRECTS or not location:
                    return Outcome("failed", f"HTTP {status}")
                try:
                    url = urldefrag(urljoin(url, location)).url
                except ValueError:  # "Invalid IPv6 URL"
                    return Outcome("failed", f"HTTP {status} to something that is not a URL")
        return Outcome("failed", f"more than {MAX_REDIRECTS} redirects")

    def _post(
        self,
        pool: httpcore.ConnectionPool,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
    ) -> tuple[int, str | None]:
        """The answer's status and ``Location``; its body is never read."""
        sent = {
            **headers,
            "host": target.host_header,
            "user-agent": USER_AGENT,
            "content-length": str(len(body)),
            "connection": "close",
        }
        extensions: dict[str, Any] = {
            "timeout": dict.fromkeys(("connect", "read", "write", "pool"), self._timeout_s)
        }
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        with pool.stream(
            "POST", target.pinned_url, headers=list(sent.items()), content=body,
            extensions=extensions,
        ) as response:  # fmt: skip
            location = next(
                (v.decode("latin-1") for k, v in response.headers if k.lower() == b"location"),
                None,
            )
            return response.status, location
