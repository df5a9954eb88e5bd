"""Receivers that behave badly — an answer dripped a byte at a time, an endless body, a
plain-HTTP server behind an https URL — end each attempt as a failed (or, for a 2xx,
delivered) outcome within the attempt's deadline, never a hang or the memory filled;
through the deliverer they are failed attempts retried with back-off. Every receiver is
a raw socket server of the test's own on 127.0.0.1."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
from prometheus_client import CollectorRegistry

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.sender import USER_AGENT, Outcome, Sender
from tests.unit.batchpipe.api.fakes import until
from tests.unit.batchpipe.api.test_webhook_deliveries import API, MemoryLog, deliverer, pending

LOOPBACK = AddressGuard(["127.0.0.1/32"])
#: how long a test waits for an attempt that must end at its 1 s deadline
BOUND_S = 30.0
#: what an endless receiver writes at most, if nobody hangs up on it
ENDLESS_CAP = 256 * 1024 * 1024


@dataclass
class Receiver:
    """One behaviour for every connection: ``handle(conn, receiver)``."""

    handle: Callable[[socket.socket, Receiver], None]
    heads: list[bytes] = field(default_factory=list)
    written: list[int] = field(default_factory=list)  # bytes each connection was sent
    hung_up: threading.Event = field(default_factory=threading.Event)


def _serve(server: socket.socket, receiver: Receiver) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and not head.startswith(b"\x16"):  # TLS
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
            receiver.heads.append(head)
            try:
                receiver.handle(conn, receiver)
            except OSError:  # the client hung up, as it should
                receiver.hung_up.set()


@pytest.fixture
def serve() -> Iterator[Callable[[Receiver], str]]:
    servers: list[socket.socket] = []

    def start(receiver: Receiver) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)
        threading.Thread(target=_serve, args=(server, receiver), daemon=True).start()
        return f"http://127.0.0.1:{server.getsockname()[1]}/hook"

    yield start
    for server in servers:
        server.close()


def send_bounded(url: str, timeout_s: float = 1.0, guard: AddressGuard = LOOPBACK) -> Outcome:
    """The attempt's outcome; fails the test if it is not back within :data:`BOUND_S`
    (in a daemon thread, so that a hang fails the test instead of holding it)."""
    sender = Sender(guard, timeout_s)
    outcomes: queue.Queue[Outcome] = queue.Queue()
    threading.Thread(
        target=lambda: outcomes.put(sender.send(url, {"webhook-id": "wh_1"}, b"{}")),
        daemon=True,
    ).start()
    try:
        return outcomes.get(timeout=BOUND_S)
    except queue.Empty:
        pytest.fail(f"the attempt was still running after {BOUND_S:g}s")


def drip(conn: socket.socket, receiver: Receiver) -> None:
    """A status line, then header lines without end, one byte each 50 ms."""
    pause = threading.Event()
    for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: 1\r\n" * 100_000:
        conn.sendall(bytes([byte]))
        pause.wait(0.05)


def endless(status: int) -> Callable[[socket.socket, Receiver], None]:
    """Answers ``status`` with a body without end (chunked), as fast as it is taken."""

    def handle(conn: socket.socket, receiver: Receiver) -> None:
        conn.sendall(f"HTTP/1.1 {status} X\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        sent = 0
        try:
            while sent < ENDLESS_CAP:
                conn.sendall(chunk)
                sent += len(chunk)
        finally:
            receiver.written.append(sent)

    return handle


def test_an_answer_dripped_a_byte_at_a_time_fails_at_the_deadline(
    serve: Callable[[Receiver], str],
) -> None:
    """Each byte comes well inside the timeout, so only a deadline on the whole attempt
    ends it (the status line arrives, the headers never end)."""
    receiver = Receiver(drip)
    outcome = send_bounded(serve(receiver))
    assert outcome.kind == "failed" and "no answer within 1s" in outcome.detail, outcome
    assert until(receiver.hung_up.is_set, BOUND_S)


@pytest.mark.parametrize(("status", "kind"), [(200, "delivered"), (500, "failed")])
def test_an_endless_body_is_never_read(
    serve: Callable[[Receiver], str], status: int, kind: str
) -> None:
    receiver = Receiver(endless(status))
    outcome = send_bounded(serve(receiver), timeout_s=10.0)
    assert outcome.kind == kind, outcome
    assert until(lambda: bool(receiver.written), BOUND_S)
    # what the kernel's buffers took before the sender hung up, far from the cap
    assert receiver.written[0] < ENDLESS_CAP // 4


def test_the_request_carries_a_user_agent_a_length_and_the_host(
    serve: Callable[[Receiver], str],
) -> None:
    def ok(conn: socket.socket, receiver: Receiver) -> None:
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    receiver = Receiver(ok)
    url = serve(receiver)
    assert send_bounded(url).kind == "delivered"
    lines = receiver.heads[0].decode().split("\r\n\r\n")[0].split("\r\n")
    assert lines[0] == "POST /hook HTTP/1.1"
    found = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
    host = url.removeprefix("http://").removesuffix("/hook")
    assert found["host"] == host and found["user-agent"] == USER_AGENT
    assert (found["content-length"], found["webhook-id"]) == ("2", "wh_1")


def test_a_plain_server_behind_an_https_url_is_a_failed_attempt(
    serve: Callable[[Receiver], str],
) -> None:
    def plain(conn: socket.socket, receiver: Receiver) -> None:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    url = serve(Receiver(plain)).replace("http://", "https://")
    outcome = send_bounded(url)
    assert outcome.kind == "failed", outcome


@pytest.mark.parametrize("location", [b"/h\xe9llo", b"http://[::1", b"http://h:99999/"])
def test_a_redirect_to_a_location_that_is_not_a_url_is_a_failed_attempt(
    serve: Callable[[Receiver], str], location: bytes
) -> None:
    def redirect(conn: socket.socket, receiver: Receiver) -> None:
        conn.sendall(b"HTTP/1.1 307 X\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n")

    receiver = Receiver(redirect)
    outcome = send_bounded(serve(receiver))
    assert outcome.kind == "failed" and len(receiver.heads) == 1, outcome


def test_a_silent_tls_server_fails_at_the_deadline(serve: Callable[[Receiver], str]) -> None:
    """A server that takes the connection and never answers the TLS handshake."""

    def silent(conn: socket.socket, receiver: Receiver) -> None:
        threading.Event().wait(BOUND_S)

    url = serve(Receiver(silent))
    outcome = send_bounded(url.replace("http://", "https://"))
    assert outcome.kind == "failed" and "no answer within 1s" in outcome.detail, outcome


def test_a_hostile_receiver_is_a_failed_attempt_retried_with_back_off(
    serve: Callable[[Receiver], str],
) -> None:
    url = serve(Receiver(drip))
    api = replace(API, webhook_timeout_s=0.5, webhook_backoff_s=60.0, webhook_backoff_max_s=60.0)
    sender = Sender(LOOPBACK, api.webhook_timeout_s)
    registry = CollectorRegistry()
    log = MemoryLog()
    log.put(pending())
    hooks = deliverer(sender.send, log, registry, api, url=url)
    hooks.resume()
    assert until(lambda: log.owed["wh_1"].attempts == 1, BOUND_S)
    hooks.close()
    later = log.owed["wh_1"]
    assert later.next_at - later.since >= 30.0  # d/2 at least: the next attempt waits
    assert (
        registry.get_sample_value("batchpipe_api_webhook_deliveries_total", {"outcome": "failed"})
        == 1
    )


def test_a_name_that_takes_forever_to_resolve_fails_at_the_deadline() -> None:
    """The receiver's own DNS server may answer as slowly as it likes."""
    stalled = threading.Event()

    def stalling(host: str, port: int) -> list[str]:
        stalled.wait(BOUND_S)
        return ["127.0.0.1"]

    try:
        outcome = send_bounded(
            "http://slow.example/h", 0.5, AddressGuard(["127.0.0.1/32"], stalling)
        )
    finally:
        stalled.set()
    assert outcome.kind == "failed" and "resolving the name took longer" in outcome.detail
