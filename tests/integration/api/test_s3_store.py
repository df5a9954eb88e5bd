"""``api.store: s3`` against an S3-protocol server over real HTTP: moto in server mode
(from PyPI). Not run against AWS or another cloud's storage.

The server runs in its own process: moto's server imports Flask, whose module-level
context proxies raise ``RuntimeError`` on ``hasattr``, and vLLM's kernel registration
walks every loaded module's attributes — the vllm tests later in the session would fail."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from batchpipe.api.s3store import S3Store
from tests.integration.api.conftest import Clock, Serve, sdk
from tests.integration.api.test_cancel_restart import slow
from tests.integration.api.test_expiry import expiry_scenario
from tests.integration.api.test_sdk_echo import batch_file
from tests.integration.harness import running_worker
from worker.config import ApiConfig, Config

pytestmark = pytest.mark.integration


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[ApiConfig]:
    """A moto S3 server on a free port with one bucket; the API settings that use it."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_port(port, server)
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(
            Bucket="batchpipe-test"
        )
        yield ApiConfig(
            store="s3",
            s3_bucket="batchpipe-test",
            s3_endpoint_url=url,
            store_dir=str(tmp_path / "staging"),
        )
    finally:
        server.terminate()
        server.wait(30)


def _wait_for_port(port: int, server: subprocess.Popen[bytes], bound_s: float = 60.0) -> None:
    """Until the moto server accepts connections (bounded; fails if it exited)."""
    give_up = time.monotonic() + bound_s
    while time.monotonic() < give_up:
        assert server.poll() is None, f"moto server exited with {server.returncode}"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"moto server not listening on {port} after {bound_s:g} s")


def test_s3_store_puts_streams_and_deletes(s3: ApiConfig, tmp_path: Path) -> None:
    store = S3Store(s3)
    store.check()
    with store.staging() as staged:
        staged.write_bytes(b"x" * 9_000_000)  # above boto3's multipart threshold
        store.put("file-1", staged)
    assert sum(len(c) for c in store.chunks("file-1")) == 9_000_000
    with store.local_copy("file-1") as path:
        assert path.stat().st_size == 9_000_000
    store.delete("file-1")
    with pytest.raises(FileNotFoundError):
        store.chunks("file-1")


def test_the_api_stores_uploads_in_s3(
    s3: ApiConfig, api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = replace(api_config, api=replace(s3, poll_interval_ms=100, port=0))
    source = batch_file(tmp_path / "in.jsonl", 3)
    with serve(config) as server:
        client = sdk(server)
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        assert client.files.content(uploaded.id).content == source.read_bytes()
        client.files.delete(uploaded.id)
    listed = boto3.client("s3", endpoint_url=s3.s3_endpoint_url).list_objects_v2(
        Bucket="batchpipe-test"
    )
    assert listed.get("KeyCount", 0) == 0


def test_expired_files_leave_the_bucket(
    s3: ApiConfig, api_config: Config, serve: Serve, clock: Clock, tmp_path: Path
) -> None:
    config = slow(replace(api_config, api=replace(s3, poll_interval_ms=100, port=0)))
    bucket = boto3.client("s3", endpoint_url=s3.s3_endpoint_url)

    def stored() -> set[str]:
        listed = bucket.list_objects_v2(Bucket="batchpipe-test", Prefix=s3.s3_prefix)
        return {o["Key"].removeprefix(s3.s3_prefix) for o in listed.get("Contents", [])}

    with serve(config) as server, running_worker(config):
        expiry_scenario(server, clock, tmp_path, stored)
