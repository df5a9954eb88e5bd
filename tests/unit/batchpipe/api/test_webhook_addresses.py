"""The outbound-address guard refuses loopback, link-local and private targets — named
directly, behind a name, or behind a redirect — before any connection is opened. No
test here sends anything anywhere but to a receiver of its own on 127.0.0.1: names are
resolved by a fake resolver, and refused addresses are never connected to."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.sender import Sender
from worker.config import ConfigError
from worker.outbound import OutboundRefused as Refused

NAMES = {
    "metadata.internal": ["169.254.169.254"],
    "intranet.example": ["10.1.2.3"],
    "split.example": ["93.184.215.14", "192.168.1.20"],  # one public, one private
    "public.example": ["93.184.215.14"],
    "localhost": ["127.0.0.1", "::1"],
}


def resolver(asked: list[str]) -> object:
    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return NAMES.get(host, [host])  # an address literal resolves to itself

    return resolve


def guard(*allowed: str, asked: list[str] | None = None) -> AddressGuard:
    return AddressGuard(allowed, resolver([] if asked is None else asked))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/h",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/h",
        "http://172.16.5.4/h",
        "http://192.168.0.10/h",
        "http://100.64.0.1/h",
        "http://0.0.0.0/h",
        "http://[::1]/h",
        "http://[fe80::1]/h",
        "http://[fd00::1]/h",
        "http://[::ffff:10.0.0.1]/h",
        "http://metadata.internal/h",
        "https://intranet.example/h",
        "https://split.example/h",
        "http://localhost:9000/h",
    ],
)
def test_targets_that_are_not_public_are_refused(url: str) -> None:
    with pytest.raises(Refused, match="not a public one"):
        guard().check(url)


def test_a_public_name_is_pinned_to_the_address_that_was_checked() -> None:
    target = guard().check("https://public.example:8443/hooks?k=1")
    assert target.pinned_url == "https://93.184.215.14:8443/hooks?k=1"
    assert (target.host, target.host_header) == ("public.example", "public.example:8443")


def test_allowed_networks_open_exactly_themselves() -> None:
    allowing = guard("127.0.0.1/32")
    assert allowing.check("http://127.0.0.1:9/h").address == "127.0.0.1"
    for url in ("http://10.0.0.1/h", "http://169.254.169.254/", "http://localhost/h"):
        with pytest.raises(Refused):  # localhost also resolves to ::1, not allowed
            allowing.check(url)


def test_an_ipv6_target_is_named_in_brackets() -> None:
    target = guard("::1/128").check("http://[::1]:8080/h")
    assert (target.pinned_url, target.host_header) == ("http://[::1]:8080/h", "[::1]:8080")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://public.example/h",
        "http:///h",
        "http://u:p@public.example/",
        "http://public.example:70000/h",
        "http://[::1/h",
        "http://public.example/a\r\nx: y",
        "http://public.example/h\xe9llo",
    ],
)
def test_urls_that_are_not_plain_http_targets_are_refused(url: str) -> None:
    with pytest.raises(Refused):
        guard().check(url)


def test_a_bad_allowed_network_stops_the_start() -> None:
    with pytest.raises(ConfigError, match="webhook_allow_networks"):
        AddressGuard(["10.0.0.0/33"])


class Redirecting(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.hits.append(self.path)
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(307)
        self.send_header("location", self.path.removeprefix("/to/"))
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Redirecting.hits = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("http://10.0.0.1/h", "10.0.0.1"),
        ("http://169.254.169.254/latest", "169.254.169.254"),
        ("http://metadata.internal/h", "169.254.169.254"),
    ],
)
def test_a_redirect_to_a_refused_target_is_not_followed(
    redirector: str, target: str, address: str
) -> None:
    """Nothing is sent there; the attempt failed (the receiver may answer otherwise on a
    later one), while a configured URL the guard refuses is refused for good."""
    asked: list[str] = []
    sender = Sender(guard("127.0.0.1/32", asked=asked), timeout_s=5)
    outcome = sender.send(f"{redirector}/to/{target}", {}, b"{}")
    sender.close()
    assert outcome.kind == "failed" and address in outcome.detail
    assert Redirecting.hits == [f"/to/{target}"]  # one POST, to the receiver only
    assert asked[0] == "127.0.0.1"
