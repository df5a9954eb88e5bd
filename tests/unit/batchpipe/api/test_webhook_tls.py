"""HTTPS deliveries go to the address the guard checked, yet the receiver's certificate
is verified for the URL's name (SNI and ``Host`` as in the URL): a receiver of the
test's own on 127.0.0.1, with a certificate for ``hooks.test`` signed by the test."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from cryptography import x509

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.sender import Sender
from tests.certs import self_signed

NAMES = {"hooks.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}


class Recording(BaseHTTPRequestHandler):
    hosts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.hosts.append(self.headers["host"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    cert_path, key_path = self_signed(tmp_path, x509.DNSName("hooks.test"), "hooks")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    Recording.hosts = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], cert_path
    server.shutdown()
    server.server_close()


def sender(cert_path: Path) -> Sender:
    guard = AddressGuard(["127.0.0.1/32"], lambda host, port: NAMES[host])
    return Sender(guard, 5.0, ssl.create_default_context(cafile=str(cert_path)))


def test_https_is_verified_for_the_urls_name_at_the_checked_address(
    receiver: tuple[int, Path],
) -> None:
    port, cert_path = receiver
    hooks = sender(cert_path)
    outcome = hooks.send(f"https://hooks.test:{port}/h", {}, b"{}")
    hooks.close()
    assert outcome.kind == "delivered", outcome
    assert Recording.hosts == [f"hooks.test:{port}"]


def test_a_certificate_for_another_name_is_a_failed_attempt(receiver: tuple[int, Path]) -> None:
    port, cert_path = receiver
    hooks = sender(cert_path)
    outcome = hooks.send(f"https://other.test:{port}/h", {}, b"{}")
    hooks.close()
    assert outcome.kind == "failed" and Recording.hosts == []
