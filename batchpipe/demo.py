"""``batchpipe demo``: broker, worker and the example batch, end to end, on this machine.

The embedded broker and the worker run here (the worker on a thread of this process);
the batch goes through the same :class:`~batchpipe.client.Client` a user calls.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

from batchpipe.client import Client
from worker.config import Config
from worker.kafka.broker import EmbeddedBroker
from worker.service import Worker


def run_demo(config: Config, requests_path: Path, out_dir: Path, timeout_s: float = 600) -> int:
    """Run ``requests_path`` through a fresh broker and worker; print what came back."""
    out_dir.mkdir(parents=True, exist_ok=True)
    output, errors = out_dir / "results.jsonl", out_dir / "errors.jsonl"
    started = time.monotonic()
    with EmbeddedBroker() as broker:
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
        client = Client(config)
        receipt = client.submit_file(requests_path)
        print(f"submit   {receipt.total} requests from {requests_path} as {receipt.batch_id}")
        status = client.collect(receipt.batch_id, output, errors, timeout_s=timeout_s)
        print(f"metrics  {worker.server.url}/metrics")
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
    ok = exit_codes == [0] and status.completed + status.failed == status.total
    return 0 if ok else 1


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
