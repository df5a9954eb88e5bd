"""The remote engine against a hostile or broken server: whatever the server sends, each
request gets exactly one answer with a code and a message naming the cause, and the engine
keeps serving the next request (never a crash, never a hang)."""

from __future__ import annotations

import contextlib
import email.utils
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.unit.worker.engines.remote.test_engine import collect, item, make
from worker.config import BatchingConfig, EngineConfig, RemoteConfig
from worker.engines.base import Completion
from worker.engines.factory import create_engine
from worker.engines.remote.engine import RemoteEngine, retry_after_s
from worker.errors import ErrorCode, ModelLoadError

Script = Callable[[BaseHTTPRequestHandler], None]

ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def raw(status: int, body: bytes, headers: dict[str, str] | None = None) -> Script:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        # Connection: close, so the client never reuses a connection this server closes
        every = {"Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
        for name, value in every.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(body)

    return send


def head(h: BaseHTTPRequestHandler, headers: dict[str, str]) -> None:
    """A 200's status line and ``headers``, and Connection: close."""
    h.send_response(200)
    for name, value in {**headers, "Connection": "close"}.items():
        h.send_header(name, value)
    h.end_headers()


def endless(pause_s: float, chunk: bytes) -> Script:
    """A 200 whose body never ends: ``chunk`` after ``chunk``, ``pause_s`` apart."""

    def send(h: BaseHTTPRequestHandler) -> None:
        head(h, {"Content-Type": "application/json"})
        h.wfile.write(b'{"choices": ["')
        while True:
            h.wfile.write(chunk)
            h.wfile.flush()
            if pause_s:
                time.sleep(pause_s)

    return send


def cut_short(h: BaseHTTPRequestHandler) -> None:
    """Promises 1,000 bytes, sends 10, closes."""
    head(h, {"Content-Length": "1000"})
    h.wfile.write(b'{"choices"')
    h.wfile.flush()


class Hostile:
    """An OpenAI-shaped server that answers each POST with the next script (a proper chat
    completion when none is left) and counts what reached it."""

    def __init__(self) -> None:
        self.scripts: queue.Queue[Script] = queue.Queue()
        self.paths: list[str] = []
        self.models_status = 200
        self.models: Script | None = None  # instead of the list of models
        self.metrics_keys: list[str | None] = []  # the Authorization of each /metrics read
        self.metrics: Script = raw(200, b"vllm:num_requests_waiting 0\n")
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hostile.paths.append(self.path)
                if self.path == "/metrics":
                    hostile.metrics_keys.append(self.headers.get("Authorization"))
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        hostile.metrics(self)
                    return
                if hostile.models is not None:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        hostile.models(self)
                    return
                if hostile.models_status != 200:
                    error = {"error": {"message": "Incorrect API key provided"}}
                    raw(hostile.models_status, json.dumps(error).encode())(self)
                    return
                raw(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())(self)

            def do_POST(self) -> None:
                hostile.paths.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.close_connection = True
                try:
                    script = hostile.scripts.get_nowait()
                except queue.Empty:
                    script = raw(200, json.dumps(ANSWER).encode())
                with contextlib.suppress(OSError):  # the client gave up on us
                    script(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    yield server
    server.server.shutdown()
    server.server.server_close()


def engine_for(server: Hostile, **remote: Any) -> RemoteEngine:
    return make(server, **{"max_retries": 1, "timeout_s": 2.0, **remote})


def answer_of(server: Hostile, script: Script | None, **remote: Any) -> Completion:
    """The one answer a request gets when the server plays ``script`` at every attempt;
    then the same engine still answers a request the server serves properly."""
    engine = engine_for(server, **remote)
    try:
        if script is not None:
            for _ in range(engine._remote.max_retries + 1):
                server.scripts.put(script)
        engine.submit(item(engine, "hit"))
        hit = collect(engine, {"hit"})["hit"]
        while not server.scripts.empty():  # not every attempt was needed
            server.scripts.get_nowait()
        engine.submit(item(engine, "next"))
        assert collect(engine, {"next"})["next"].text == "fine"
        return hit
    finally:
        engine.close()


def assert_failed(c: Completion, code: ErrorCode, *words: str) -> None:
    assert c.error is not None, c
    assert c.error.code == code, c.error
    for word in words:
        assert word in c.error.message, c.error.message


def test_a_proper_answer_is_read(hostile: Hostile) -> None:
    c = answer_of(hostile, None)
    assert c.error is None and c.text == "fine" and c.prompt_tokens == 3


def test_a_huge_body_is_cut_off_while_it_streams(hostile: Hostile) -> None:
    c = answer_of(hostile, endless(0.0, b"x" * 65536), max_response_bytes=1 << 20)
    assert_failed(c, ErrorCode.ENGINE_FAILED, "max_response_bytes")


def test_a_declared_huge_body_is_refused_before_reading(hostile: Hostile) -> None:
    lying = raw(200, b"{}", {"Content-Length": str(1 << 40)})
    c = answer_of(hostile, lying, max_response_bytes=1 << 20)
    assert_failed(c, ErrorCode.ENGINE_FAILED, "max_response_bytes")


def test_a_slow_drip_meets_one_deadline_per_attempt(hostile: Hostile) -> None:
    c = answer_of(hostile, endless(0.02, b"x"), timeout_s=0.5)
    assert_failed(c, ErrorCode.ENGINE_FAILED, "2 attempts", "no answer within 0.5 s")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", ("not JSON",)),
        (b"[" * 100_000 + b"]" * 100_000, ("not JSON",)),
        (b'{"choices": "abc"}', ("not readable",)),
        (b'{"choices": [{"index": 0, "message": "hi"}]}', ("not readable",)),
        (b'["a list"]', ("not readable",)),
        (b'{"error": {"message": "model overloaded", "type": "server_error"}}', ("overloaded",)),
    ],
)
def test_an_unreadable_200_fails_its_request_only(
    hostile: Hostile, body: bytes, words: tuple[str, ...]
) -> None:
    c = answer_of(hostile, raw(200, body, {"Content-Type": "application/json"}))
    assert_failed(c, ErrorCode.ENGINE_FAILED, *words)


def test_a_body_that_does_not_decode_fails_its_request_only(hostile: Hostile) -> None:
    c = answer_of(hostile, raw(200, b"\x00not gzip at all", {"Content-Encoding": "gzip"}))
    assert_failed(c, ErrorCode.ENGINE_FAILED, "could not be read")


def test_an_html_502_page_is_retried_then_named(hostile: Hostile) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1>" + b" " * 200_000 + b"</body></html>"
    c = answer_of(hostile, raw(502, page, {"Content-Type": "text/html"}))
    assert_failed(c, ErrorCode.ENGINE_FAILED, "2 attempts", "HTTP 502", "502 Bad Gateway")
    assert c.error is not None and len(c.error.message) < 1000


def test_a_redirect_is_not_followed(hostile: Hostile) -> None:
    c = answer_of(hostile, raw(307, b"", {"Location": "http://169.254.169.254/latest"}))
    assert_failed(c, ErrorCode.ENGINE_FAILED, "HTTP 307")
    assert hostile.paths.count("/v1/chat/completions") == 2, "one for hit, one for next"


def test_each_outcome_is_counted_under_its_own_label(hostile: Hostile) -> None:
    engine = engine_for(hostile, max_retries=0)
    try:
        scripts = {
            "redirect": raw(307, b"", {"Location": "/elsewhere"}),
            "bad": raw(400, b'{"error": {"message": "no"}}'),
            "big": raw(200, b"{}", {"Content-Length": str(1 << 40)}),
            "html": raw(200, b"<html>"),
        }
        for key, script in scripts.items():
            hostile.scripts.put(script)
            engine.submit(item(engine, key))
            collect(engine, {key})
        engine.submit(item(engine, "ok"))
        collect(engine, {"ok"})
        counts = engine._snapshot().responses
        assert {k: counts[k] for k in counts if counts[k]} == {
            "http_other": 1,
            "http_4xx": 1,
            "too_large": 1,
            "unreadable": 1,
            "ok": 1,
        }
        exported = {
            sample.labels["outcome"]: sample.value
            for family in engine.collectors()[0].collect()
            if family.name == "batchpipe_remote_responses"
            for sample in family.samples
            if sample.name.endswith("_total")
        }
        assert exported["http_other"] == 1 and exported["too_large"] == 1
    finally:
        engine.close()


def test_a_close_mid_body_is_retried_then_named(hostile: Hostile) -> None:
    c = answer_of(hostile, cut_short)
    assert_failed(c, ErrorCode.ENGINE_FAILED, "2 attempts", "connection failed")


def test_a_4xx_error_object_is_4002_with_the_servers_message(hostile: Hostile) -> None:
    error = {"error": {"message": "max_tokens is too large", "param": "max_tokens"}}
    c = answer_of(hostile, raw(400, json.dumps(error).encode()))
    assert_failed(c, ErrorCode.INVALID_PARAMETER, "HTTP 400", "max_tokens is too large")


def test_retry_after_reads_seconds_and_dates_and_refuses_nonsense() -> None:
    now = 1_800_000_000.0
    assert retry_after_s("7", now) == 7.0
    assert retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
    for value in (None, "", "-5", "nan", "inf", "soon", email.utils.formatdate(now - 30)):
        assert retry_after_s(value, now) == 0.0, value
    assert retry_after_s("1e12", now) == 1e12  # the caller caps it at backoff_max_s


def test_an_absurd_retry_after_is_capped_at_backoff_max(hostile: Hostile) -> None:
    c = answer_of(hostile, raw(429, b"{}", {"Retry-After": "99999999"}), backoff_max_s=0.05)
    assert_failed(c, ErrorCode.ENGINE_FAILED, "2 attempts", "HTTP 429")


def test_a_key_variable_that_is_not_set_or_not_accepted_is_named(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNSET_KEY_FOR_TEST", raising=False)
    with pytest.raises(ModelLoadError, match="api_key_env: the environment variable UNSET_KEY"):
        engine_for(hostile, api_key_env="UNSET_KEY_FOR_TEST")
    hostile.models_status = 401
    monkeypatch.setenv("EMPTY_KEY_FOR_TEST", "")
    with pytest.raises(
        ModelLoadError, match=r"HTTP 401 \(.*api_key_env: EMPTY_KEY_FOR_TEST, unset"
    ):
        engine_for(hostile, api_key_env="EMPTY_KEY_FOR_TEST")


def test_an_endless_metrics_page_is_cut_off_and_read_again(hostile: Hostile) -> None:
    hostile.metrics = endless(0.0, b"# vllm:num_requests_waiting " * 4096)
    metrics_url = hostile.base_url.removesuffix("/v1") + "/metrics"
    engine = engine_for(hostile, metrics_url=metrics_url, metrics_interval_ms=50)
    try:
        deadline = time.monotonic() + 60.0
        while hostile.paths.count("/metrics") < 3:  # each reading ended: not stuck in one
            assert time.monotonic() < deadline, "the queue watcher is stuck in one reading"
            time.sleep(0.05)
        assert engine._snapshot().server_waiting == -1
        engine.submit(item(engine, "k"))
        assert collect(engine, {"k"})["k"].text == "fine"
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("models", "words"),
    [
        (endless(0.02, b"x"), "no answer within 0.5 s"),
        (endless(0.0, b"x" * 65536), "max_response_bytes"),
        (raw(200, b'["m"]'), "not a list of models"),
        (raw(200, b"<html>"), "cannot list the models"),
        (raw(200, b"[" * 100_000), "not a list of models"),
    ],
)
def test_a_hostile_models_list_stops_the_start_with_5003(
    hostile: Hostile, models: Script, words: str
) -> None:
    hostile.models = models
    with pytest.raises(ModelLoadError, match=words):
        engine_for(hostile, timeout_s=0.5, max_response_bytes=1 << 20)


def test_the_key_never_goes_to_a_metrics_url_on_another_origin(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEY_FOR_TEST", "sk-secret")
    port = hostile.base_url.split(":")[2].split("/")[0]
    for host, expected in (("127.0.0.1", "Bearer sk-secret"), ("localhost", None)):
        hostile.metrics_keys.clear()
        engine = engine_for(
            hostile,
            api_key_env="KEY_FOR_TEST",
            metrics_url=f"http://{host}:{port}/metrics",
            metrics_interval_ms=50,
        )
        try:
            deadline = time.monotonic() + 60.0
            while engine._snapshot().server_waiting != 0:  # read, through to the engine
                assert time.monotonic() < deadline, "the queue was never read"
                time.sleep(0.05)
        finally:
            engine.close()
        assert hostile.metrics_keys and set(hostile.metrics_keys) == {expected}, host


def test_a_body_that_is_not_json_is_4002_and_the_engine_serves_on(hostile: Hostile) -> None:
    engine = engine_for(hostile)
    try:
        engine.submit(item(engine, "nan", temperature=float("nan")))
        engine.submit(item(engine, "next"))
        done = collect(engine, {"nan", "next"})
        assert_failed(done["nan"], ErrorCode.INVALID_PARAMETER, "cannot be sent as JSON")
        assert done["next"].error is None and done["next"].text == "fine"
    finally:
        engine.close()


def test_retries_stop_before_the_worker_would_wedge(hostile: Hostile) -> None:
    """The in-flight stage wedges the worker when nothing completes for engine_timeout_s:
    a hanging server gets a request's 5000 before that, whatever max_retries allows."""
    remote = replace(
        RemoteConfig(),
        base_url=hostile.base_url,
        allow_private=True,
        timeout_s=0.3,
        max_retries=50,
        backoff_s=0.01,
        backoff_max_s=0.05,
    )
    config = EngineConfig(kind="openai", model="m", engine_timeout_s=1.5, remote=remote)
    engine = create_engine(config, BatchingConfig())
    assert isinstance(engine, RemoteEngine)
    engine.load()
    try:
        for _ in range(50):
            hostile.scripts.put(endless(0.02, b"x"))
        engine.submit(item(engine, "k"))
        c = collect(engine, {"k"})["k"]
        assert_failed(c, ErrorCode.ENGINE_FAILED, "outlast 0.9 × engine.engine_timeout_s")
        assert engine._snapshot().retries < 50
    finally:
        engine.close()
