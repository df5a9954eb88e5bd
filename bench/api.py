"""The OpenAI API path vs the CLI path on the same 50,000-line (~20 MB) batch file.

Side by side in one run, on one embedded broker, with no worker (both measure getting a
batch onto the requests topic):

- **CLI**: ``batchpipe submit FILE`` as a subprocess (validate, publish in one transaction).
- **API**: ``batchpipe serve`` as a subprocess; the file is uploaded (``POST /v1/files``,
  validated and stored), a batch created (``POST /v1/batches``) and polled until it is
  ``in_progress`` (its requests published in one transaction). The server's RSS is sampled
  from ``/proc`` every 20 ms during the upload.

Reports both times, their ratio (the goal is at most 1.5×) and the server's RSS growth
during the upload against the file's size (the goal is at most 2×: the upload is streamed
to disk, never held in memory).

    .venv/bin/python -m bench.api [--lines 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from bench.common import fresh_config, write_result
from tests import ROOT
from worker.kafka.broker import EmbeddedBroker

PADDING = "Summarise the following news brief in one sentence. " * 6


def write_file(path: Path, lines: int) -> int:
    with path.open("w") as out:
        for i in range(lines):
            body = {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": f"{PADDING} Brief number {i}."}],
                "max_tokens": 32,
            }
            out.write(
                json.dumps(
                    {
                        "custom_id": f"r{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    }
                )
                + "\n"
            )
    return path.stat().st_size


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def env_for(config: Any, store: Path) -> dict[str, str]:
    k = config.kafka
    return {
        **{n: v for n, v in os.environ.items() if not n.startswith("BATCHPIPE_")},
        "BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "BATCHPIPE_KAFKA__REQUESTS_TOPIC": k.requests_topic,
        "BATCHPIPE_KAFKA__RESULTS_TOPIC": k.results_topic,
        "BATCHPIPE_KAFKA__DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "BATCHPIPE_KAFKA__STATE_TOPIC": f"{k.requests_topic}-state",
        "BATCHPIPE_KAFKA__CONTROL_TOPIC": f"{k.requests_topic}-control",
        "BATCHPIPE_API__STORE_DIR": str(store),
        "BATCHPIPE_API__POLL_INTERVAL_MS": "100",
    }


def cli_seconds(path: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "batchpipe.cli", "submit", str(path)],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def api_run(path: Path, env: dict[str, str]) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "batchpipe.cli", "serve", "--no-auth", "--port", str(port)],
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "serve did not start"
            time.sleep(0.2)
        before = rss_bytes(server.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], rss_bytes(server.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        with path.open("rb") as stream:
            uploaded = requests.post(
                f"{url}/v1/files",
                files={"file": (path.name, stream)},
                data={"purpose": "batch"},
                timeout=600,
            )
        uploaded.raise_for_status()
        upload_s = time.perf_counter() - started
        done.set()
        sampler.join()
        batch = requests.post(
            f"{url}/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            timeout=60,
        ).json()
        while batch["status"] == "validating":
            time.sleep(0.05)
            batch = requests.get(f"{url}/v1/batches/{batch['id']}", timeout=60).json()
        assert batch["status"] == "in_progress", batch
        total_s = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(60)
    return {
        "api_s": total_s,
        "upload_s": upload_s,
        "publish_s": total_s - upload_s,
        "rss_before_bytes": before,
        "rss_peak_bytes": peak[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.jsonl"
        size = write_file(path, args.lines)
        cli_config = fresh_config(broker.bootstrap)
        api_config = fresh_config(broker.bootstrap)
        cli_s = cli_seconds(path, env_for(cli_config, Path(tmp) / "cli-files"))
        api = api_run(path, env_for(api_config, Path(tmp) / "api-files"))
    growth = api["rss_peak_bytes"] - api["rss_before_bytes"]
    result = {
        "lines": args.lines,
        "file_bytes": size,
        "cli_s": round(cli_s, 2),
        "api_s": round(api["api_s"], 2),
        "api_upload_s": round(api["upload_s"], 2),
        "api_publish_s": round(api["publish_s"], 2),
        "api_over_cli": round(api["api_s"] / cli_s, 3),
        "server_rss_before_mib": round(api["rss_before_bytes"] / 2**20, 1),
        "server_rss_peak_mib": round(api["rss_peak_bytes"] / 2**20, 1),
        "server_rss_growth_over_file": round(growth / size, 3),
        "note": "no worker runs: both paths end when the requests are on the requests topic",
    }
    print(json.dumps(result, indent=2))
    write_result("api", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
