"""Limits a hostile client meets (issue 24, defects 2, 3, 4, 7, 10): bodies refused as
they stream, bounded error messages, wrong types as 400s naming the field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from batchpipe.api.app import create_app
from batchpipe.api.guard import MAX_JSON_BYTES
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    KEYS,
    client,
    services,
    stored_file,
    unit_config,
)

_CHUNK = 64 * 1024


def _drive(
    svc: Any, method: str, path: str, headers: dict[str, str], chunks: Iterator[bytes]
) -> tuple[int, dict[str, Any], int]:
    """Send a body chunk by chunk straight to the ASGI app (as uvicorn does with a
    chunked upload); the status, the JSON answer and how many chunks the app pulled."""
    app = create_app(svc.config, svc.keys, start=lambda config, keys: svc)
    app.state.services = svc
    pulled = 0
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        nonlocal pulled
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), pulled


def _multipart(size: int) -> Iterator[bytes]:
    yield (
        b'--XX\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n"
    )
    for _ in range(size // _CHUNK):
        yield b"x" * _CHUNK
    yield b"\r\n--XX--\r\n"


def test_a_chunked_upload_is_refused_once_it_passes_the_limit(tmp_path: Path) -> None:
    """Defect 3: no Content-Length; the body is counted as it streams, not spooled whole."""
    svc = services(unit_config(tmp_path, max_file_bytes=100_000))
    headers = {
        **ALICE,
        "host": "127.0.0.1:8000",
        "content-type": "multipart/form-data; boundary=XX",
    }
    status, body, pulled = _drive(svc, "POST", "/v1/files", headers, _multipart(64 * _CHUNK))
    assert (status, body["error"]["code"]) == (413, "file_too_large")
    assert pulled * _CHUNK <= 100_000 + 64 * 1024 + 2 * _CHUNK  # not the 4 MiB sent
    assert list((tmp_path / "files" / "objects").iterdir()) == []


def test_a_json_body_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    """Defect 4: a declared length over the limit is 413 before a byte is read; a chunked
    one as soon as it passes the limit."""
    svc = services(unit_config(tmp_path))
    headers = {**ALICE, "host": "127.0.0.1", "content-type": "application/json"}
    huge = {**headers, "content-length": str(300 * 1024 * 1024)}
    status, body, pulled = _drive(svc, "POST", "/v1/batches", huge, iter([b"{}"] * 10))
    assert (status, body["error"]["code"], pulled) == (413, "request_too_large", 0)
    endless = (b" " * _CHUNK for _ in range(10_000))
    status, body, pulled = _drive(svc, "POST", "/v1/batches", headers, endless)
    assert status == 413
    assert pulled * _CHUNK <= MAX_JSON_BYTES + _CHUNK


def test_a_file_of_many_bad_lines_gets_a_bounded_answer(tmp_path: Path) -> None:
    """Defect 2: 20,000 bad lines are not 20,000 listed problems; reading stops at the
    line limit."""
    with client(services(unit_config(tmp_path, max_lines=50_000))) as http:
        answer = http.post(
            "/v1/files",
            headers=ALICE,
            files={"file": ("bad.jsonl", b"1\n" * 20_000)},
            data={"purpose": "batch"},
        )
        assert answer.status_code == 400
        message = answer.json()["error"]["message"]
        assert "20000 problems" in message and "and 19900 more not listed" in message
        assert len(answer.content) < 20_000
    with client(services(unit_config(tmp_path / "b", max_lines=5))) as http:
        answer = http.post(
            "/v1/files",
            headers=ALICE,
            files={"file": ("bad.jsonl", b"1\n" * 50)},
            data={"purpose": "batch"},
        )
        message = answer.json()["error"]["message"]
        assert "more than 5 requests" in message
        assert "line 7:" not in message and "line 50:" not in message


def test_wrong_types_and_deep_nesting_are_400s_naming_the_field(tmp_path: Path) -> None:
    """Defect 7: each a 400 naming the field, never a 500."""
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        file = stored_file(svc)
        good = {
            "input_file_id": file.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        for field, value in (
            ("endpoint", ["x"]),
            ("completion_window", {}),
            ("input_file_id", 7),
            ("metadata", ["a"]),
            ("metadata", {"k": 1}),
        ):
            answer = http.post("/v1/batches", headers=ALICE, json={**good, field: value})
            assert answer.status_code == 400, (field, answer.text)
            assert answer.json()["error"]["param"] == field
        deep = http.post(
            "/v1/batches",
            headers={**ALICE, "content-type": "application/json"},
            content=b"[" * 100_000 + b"]" * 100_000,
        )
        assert deep.status_code == 400, deep.text
        assert "nested too deeply" in deep.json()["error"]["message"]
        plain = http.post(
            "/v1/batches", headers={**ALICE, "content-type": "text/plain"}, content=json.dumps(good)
        )
        assert (plain.status_code, plain.json()["error"]["code"]) == (415, "unsupported_media_type")
        assert http.post("/v1/batches", headers=ALICE, json=good).status_code == 200


def test_no_schema_or_docs_pages_are_served(tmp_path: Path) -> None:
    """Defect 10: /openapi.json, /docs and /redoc are not served, with a key or without."""
    with client(services(unit_config(tmp_path), KEYS)) as http:
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert http.get(path).status_code == 404
            assert http.get(path, headers=ALICE).status_code == 404
