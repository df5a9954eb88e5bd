"""Keys exactly as written (defect 8) and --no-auth closed to web pages (defect 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchpipe.api.auth import Keys, load_keys
from tests.unit.batchpipe.api.fakes import client, services, stored_file, unit_config
from worker.config import ApiConfig, ConfigError

OPEN = Keys({}, open=True)


def _load(tmp_path: Path, text: str) -> Keys:
    keys_file = tmp_path / "keys"
    keys_file.write_text(text)
    return load_keys(ApiConfig(keys_file=str(keys_file)), no_auth=False, environ={})


def test_a_key_is_exactly_what_the_file_says(tmp_path: Path) -> None:
    keys = _load(tmp_path, "# team\ncarol: sk-carol#SUFFIX\n  dave:   sk-d  \n")
    assert keys.owner("Bearer sk-carol#SUFFIX") == "carol"
    assert keys.owner("Bearer sk-d") == "dave"
    with pytest.raises(Exception, match="Incorrect API key"):
        keys.owner("Bearer sk-carol")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("BAREKEY:tail\n", "space after the colon"),
        ("alice: sk-a # laptop\n", "no spaces"),
        ("al ice: sk-a\n", "not a name"),
        ("alice: sk-a\nbob: sk-a\n", "twice"),
    ],
)
def test_a_line_read_two_ways_refuses_the_start_naming_it(
    tmp_path: Path, text: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=rf"line {text.count(chr(10))}: .*{why}"):
        _load(tmp_path, text)


def test_open_mode_answers_loopback_hosts_only(tmp_path: Path) -> None:
    with client(services(unit_config(tmp_path), OPEN)) as http:
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "127.0.0.1"):
            assert http.get("/v1/files", headers={"host": host}).status_code == 200, host
        for host in ("evil.example:8000", "192.168.1.5:8000", ""):
            refused = http.get("/v1/files", headers={"host": host})
            assert refused.status_code == 403, host
            assert refused.json()["error"]["code"] == "host_not_allowed"


def test_open_mode_refuses_cross_origin_writes(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path), OPEN)
    with client(svc) as http:
        file = stored_file(svc, owner="local")
        body = {"input_file_id": file.id, "endpoint": "/v1/chat/completions"}
        page = {"origin": "http://evil.example"}
        form = http.post(
            "/v1/files", headers=page, files={"file": ("a.jsonl", b"{}")}, data={"purpose": "batch"}
        )
        assert (form.status_code, form.json()["error"]["code"]) == (403, "cross_origin")
        batch = http.post("/v1/batches", headers=page, json=body)
        assert batch.status_code == 403
        # a page can send text/plain without a preflight: JSON must say it is JSON
        text = http.post("/v1/batches", headers={"content-type": "text/plain"}, content=b'{"a": 1}')
        assert text.status_code == 415
        assert http.get("/v1/files", headers=page).status_code == 200  # reads are not writes
        own = http.post(
            "/v1/batches",
            headers={"origin": "http://127.0.0.1:8000"},
            json={**body, "completion_window": "24h"},
        )
        assert own.status_code == 200, own.text
