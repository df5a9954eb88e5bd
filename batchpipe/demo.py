"""``batchpipe demo``: broker, worker and the example batch, end to end, on this machine.

The embedded broker and the worker run here (the worker on a thread of this process);
the batch goes through the same :class:`~batchpipe.client.Client` a user calls. The
example batch ships in the package (``batchpipe/examples/requests.jsonl``; the
repository's ``examples/requests.jsonl`` links to it), so the demo runs from any
directory. The batch file is read and checked before anything starts. The echo engine
(``--set engine.kind=echo``, no model) serves the model name ``echo``: the demo addresses
the batch to it and says so. The exit code is 1 when any line failed.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from batchpipe.batchfile import scan_file
from batchpipe.client import Client
from worker.config import Config
from worker.kafka.broker import EmbeddedBroker
from worker.loop.service import Worker

#: the model name the echo engine answers to (worker/engines/echo.py)
ECHO_MODEL = "echo"


def example_requests() -> Path:
    """The packaged example batch, whatever the working directory."""
    return Path(str(resources.files("batchpipe").joinpath("examples", "requests.jsonl")))


def _for_echo(requests_path: Path, folder: Path) -> Path:
    """``requests_path`` with every line addressed to the echo engine's model."""
    rows = [json.loads(line) for line in requests_path.read_text().splitlines() if line.strip()]
    for row in rows:
        row["body"]["model"] = ECHO_MODEL
    path = folder / "requests.echo.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run_demo(
    config: Config, requests_path: Path | None, out_dir: Path, timeout_s: float = 600
) -> int:
    """Run ``requests_path`` (default: the example) through a fresh broker and worker;
    print what came back. 0 when every line completed."""
    requests_path = requests_path or example_requests()
    scan = scan_file(requests_path)  # a missing or bad file stops the demo before it starts
    out_dir.mkdir(parents=True, exist_ok=True)
    output, errors = out_dir / "results.jsonl", out_dir / "errors.jsonl"
    started = time.monotonic()
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as scratch:
        print(f"broker   {broker.bootstrap} (embedded Tansu, in memory)", flush=True)
        config = replace(
            config,
            kafka=replace(config.kafka, bootstrap_servers=broker.bootstrap),
            metrics=replace(config.metrics, host="127.0.0.1", port=0),
        )
        worker = Worker(config)
        exit_codes: list[int] = []
        thread = threading.Thread(target=lambda: exit_codes.append(worker.run()), daemon=True)
        thread.start()
        engine = worker.engine
        print(
            f"worker   engine={worker.config.engine.kind} ({engine.mode.replace('_', ' ')}) "
            f"model={engine.model_name}",
            flush=True,
        )
        if engine.model_name == ECHO_MODEL and scan.models - {"", ECHO_MODEL}:
            print(
                f"         the echo engine answers model {ECHO_MODEL!r}: the batch's "
                f"{', '.join(sorted(scan.models - {''}))} lines are sent to it as {ECHO_MODEL!r}"
            )
            requests_path = _for_echo(requests_path, Path(scratch))
        client = Client(config)
        receipt = client.submit_file(requests_path)
        print(f"submit   {receipt.total} requests from {requests_path} as {receipt.batch_id}")
        url = _metrics_url(worker)
        if url is not None:
            print(f"metrics  {url}/metrics (while the demo runs)", flush=True)
        status = client.collect(receipt.batch_id, output, errors, timeout_s=timeout_s)
        snap = worker.metrics.snapshot()
        worker.stop()
        thread.join(60)
    _print_results(output, errors)
    elapsed = time.monotonic() - started
    # an in-flight engine forms no batches of ours: its own scheduler adds and retires
    # sequences at every step, so the batch metrics stay empty
    feeding = (
        f"{snap.batches} batches, mean size {snap.mean_batch_size:.1f}"
        if engine.mode == "static"
        else "fed in flight"
    )
    print(
        f"\n{status.completed} completed, {status.failed} failed of {status.total}; "
        f"{feeding}; "
        f"tokens prompt={snap.tokens_prompt} completion={snap.tokens_completion}; "
        f"{elapsed:.1f}s in all"
    )
    print(f"files    {output} {errors}")
    ok = exit_codes == [0] and status.completed == status.total
    if status.failed:
        print(f"demo failed: {status.failed} of {status.total} lines failed (see {errors})")
    return 0 if ok else 1


def _metrics_url(worker: Worker, wait_s: float = 10.0) -> str | None:
    """The worker's metrics URL once its server listens (the first thing its thread
    does), None when metrics are off or it is not up within ``wait_s``."""
    if not worker.config.metrics.enabled:
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            return worker.server.url
        except RuntimeError:  # not started yet
            time.sleep(0.05)
    return None


def _print_results(output: Path, errors: Path) -> None:
    for path in (output, errors):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            row = json.loads(line)
            body = row["response"]["body"]
            if row.get("error"):
                error = row["error"]
                print(f"  {row['custom_id']:>10}  ERROR {error['code']}: {error['message']}")
            else:
                choice = body["choices"][0]  # chat.completion or text_completion
                text = choice["message"]["content"] if "message" in choice else choice["text"]
                text = text.replace("\n", " ")
                print(f"  {row['custom_id']:>10}  {text[:110]}")
