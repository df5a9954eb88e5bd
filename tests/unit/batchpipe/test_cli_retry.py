"""``batchpipe retry`` when the answer is not the one hoped for — a refusal, a page that
is not JSON, nobody listening, an id with a slash — and ``batchpipe serve`` refusing a
webhook URL before it waits for Kafka: a message and an exit code, never a traceback.
The server is a stdlib one of the test's own, scripted per test."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from batchpipe.cli import main
from tests.unit.batchpipe.test_cli_help import UNUSED_BOOTSTRAP

RETRIED = {
    "object": "batchpipe.retry",
    "retry_of": "batch_1",
    "batch": {"id": "batch_2"},
    "retried": 1,
    "not_retried": [{"custom_id": "bad", "code": "4002", "reason": "an invalid parameter"}],
}
NOT_FOUND = {
    "error": {
        "message": "No such batch: 'batch_x'",
        "type": "invalid_request_error",
        "param": "batch_id",
        "code": "not_found",
    }
}


class Scripted(BaseHTTPRequestHandler):
    status: ClassVar[int] = 200
    body: ClassVar[bytes] = b""
    seen: ClassVar[list[tuple[str, str | None]]] = []  # (path, authorization)

    def do_POST(self) -> None:
        self.seen.append((self.path, self.headers.get("authorization")))
        self.send_response(self.status)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    Scripted.seen = []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def answer(status: int, body: object) -> None:
    Scripted.status = status
    Scripted.body = body if isinstance(body, bytes) else json.dumps(body).encode()


def retry(url: str, batch_id: str = "batch_1") -> int:
    return main(["retry", batch_id, "--url", url, "--api-key", "sk-alice"])


def test_a_retry_prints_the_new_batch_and_why_lines_were_not_retried(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer(200, RETRIED)
    assert retry(f"{server}/v1/") == 0  # the SDK's base_url works too
    out, err = capsys.readouterr()
    assert out == "batch_2\n"
    assert "not retried: bad (4002): an invalid parameter" in err
    assert Scripted.seen == [("/v1/batches/batch_1/retry", "Bearer sk-alice")]


def test_a_batch_retried_before_prints_its_retry_batch_and_says_so(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer(200, RETRIED | {"already_retried": True})
    assert retry(server) == 0
    out, err = capsys.readouterr()
    assert out == "batch_2\n"
    assert "batch_1 already retried as batch_2" in err and "lines of batch_1 retried" not in err


def test_a_refusal_is_printed_with_its_status(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer(404, NOT_FOUND)
    assert retry(server, "batch_x") == 1
    assert capsys.readouterr().err == "batchpipe: 404: No such batch: 'batch_x'\n"


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (502, b"<html>Bad Gateway</html>", "502: Bad Gateway"),
        (500, {"error": "boom"}, "500: Internal Server Error"),
        (200, b"<html>a login page</html>", "something other than a retry"),
        (200, {"id": "batch_2"}, "something other than a retry"),
    ],
)
def test_an_answer_that_is_not_the_apis_is_reported_not_raised(
    server: str, capsys: pytest.CaptureFixture[str], status: int, body: object, message: str
) -> None:
    answer(status, body)
    assert retry(server) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_id_is_sent_as_one_path_segment(server: str) -> None:
    answer(404, NOT_FOUND)
    assert retry(server, "../files?x=1") == 1
    assert Scripted.seen[0][0] == "/v1/batches/..%2Ffiles%3Fx%3D1/retry"


def test_nobody_listening_is_reported_naming_the_url(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening
        assert retry(url) == 1
    assert capsys.readouterr().err.startswith(f"batchpipe: cannot reach batchpipe serve at {url}")


def test_serve_refuses_a_bad_webhook_url_before_waiting_for_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice: sk-alice\n")
    config = tmp_path / "serve.yaml"
    hook = {"url": "https://alice:hunter2@hooks.example/h", "secret_env": "ALICE_HOOK"}
    config.write_text(
        yaml.safe_dump({"api": {"keys_file": str(keys), "webhooks": {"alice": hook}}})
    )
    monkeypatch.setenv("ALICE_HOOK", "whsec_dGVzdA==")
    assert main(["serve", "-c", str(config), "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batchpipe: api.webhooks.alice.url: ") and "hunter2" not in err
