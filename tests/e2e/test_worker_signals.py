"""Items 11 and 12 of issue 41: what a running worker tells its operator. An idle worker's
lag reads 0 (transaction markers are not requests), and a remote server that is down is
in the worker's log while its requests fail."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from bench.openai_standin import StandIn
from tests.e2e.cli import echo_examples, run, wait_until, worker, write_config
from tests.integration.fleet import free_port

pytestmark = pytest.mark.e2e

LAG = re.compile(r'^batchpipe_consumer_lag\{partition="(\d+)",topic="[^"]+"\} (\S+)$', re.M)


def lags(url: str) -> dict[str, float]:
    try:
        page = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    return {partition: float(value) for partition, value in LAG.findall(page)}


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_idle_worker_reads_lag_0_on_every_partition(tmp_path: Path, broker: str) -> None:
    port = free_port()
    config = write_config(
        tmp_path, broker, {"kind": "echo"}, metrics={"host": "127.0.0.1", "port": port}
    )
    url = f"http://127.0.0.1:{port}"
    with worker(config):
        for _ in range(3):  # several transactions on the requests topic, each with its marker
            submitted = run("submit", str(echo_examples(tmp_path)), "-c", str(config))
            assert submitted.returncode == 0, submitted.stderr
            out = tmp_path / "out.jsonl"
            done = run(
                "collect", submitted.stdout.strip(), "-o", str(out), "-c", str(config),
                cwd=tmp_path,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        # every answer is in; the probe measures every 5 s
        wait_until(
            lambda: len(lags(url)) == 3 and set(lags(url).values()) == {0.0},
            90,
            f"lag 0 on all 3 partitions (last read {lags(url)})",
        )


def test_a_remote_server_that_is_down_is_in_the_workers_log(tmp_path: Path, broker: str) -> None:
    standin = StandIn(model="served", token_s=0.001).start()
    port = free_port()
    engine = {
        "kind": "openai",
        "model": "served",
        "remote": {
            "base_url": standin.base_url,
            "allow_private": True,
            "max_retries": 1,
            "backoff_s": 0.05,
            "backoff_max_s": 0.1,
        },
    }
    config = write_config(tmp_path, broker, engine, metrics={"host": "127.0.0.1", "port": port})
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"r{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "served", "messages": [{"role": "user", "content": "hi"}]},
                }
            )
            + "\n"
            for i in range(20)
        )
    )
    log = tmp_path / "worker.log"
    with log.open("w") as stderr, worker(config, stderr=stderr):
        wait_until(lambda: ready(f"http://127.0.0.1:{port}"), 120, "the worker ready")
        standin.stop()  # the server goes down under a running worker
        submitted = run("submit", str(batch), "-c", str(config))
        assert submitted.returncode == 0, submitted.stderr
        errors = tmp_path / "errors.jsonl"
        done = run(
            "collect", submitted.stdout.strip(), "--errors", str(errors), "-o",
            str(tmp_path / "out.jsonl"), "--timeout", "240", "-c", str(config),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    failed = [json.loads(line) for line in errors.read_text().splitlines()]
    assert len(failed) == 20 and {f["error"]["code"] for f in failed} == {"5000"}
    text = log.read_text()
    lines = [line for line in text.splitlines() if "failed attempts" in line]
    assert lines, text
    assert standin.base_url in lines[0] and "connection" in lines[0]
    assert len(lines) < 20  # rate-limited: not one line per request
