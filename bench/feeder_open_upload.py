"""How long a large upload in progress delays another key's small batch (issue 38).

The feeder reads the pending topic read_committed, so a publish transaction left open
hides every batch committed after it. On the embedded broker, with a feeder alone (no
worker; its depth out of the way): alice publishes a 100,000-line file whose lines come
over 60 s (a slow store: ``publish_file`` reading it, as ``serve`` does), and 20 s in,
bob's 10-line batch is submitted. The figure is bob's delay: from his ``submit``
returning to all 10 of his requests being in the requests topic. Issue 38 ran two arms
in one run: publishing in chunks with an end marker, and the whole batch in one
transaction (bob's delay 0.10 s against 40.19 s: ``bench/results/feeder_open_upload.json``).
Since issue 49 a publisher writes the pending topic without a transaction at all, and
this runs that one arm (``python -m bench.publish`` measures what a transaction held).

    python -m bench.feeder_open_upload [--lines 100000] [--open-s 60] [--bob-at-s 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from batchpipe import client as client_module
from batchpipe.batchfile import iter_file
from batchpipe.client import Client
from bench.common import DemandStandin, fresh_config, write_result
from bench.fairness_arms import lines
from tests.integration.harness import reader
from worker.config import Config
from worker.feeder.feeder import Feeder
from worker.kafka.broker import EmbeddedBroker


def _paced_file(seconds: float, total: int) -> Any:
    """``iter_file`` whose lines come evenly over ``seconds``."""

    def slow(path: Any, limits: Any) -> Iterator[Any]:
        started = time.monotonic()
        for n, request in enumerate(iter_file(path, limits)):
            wait = started + seconds * n / total - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            yield request

    return slow


def _bob_fed(config: Config, deadline: float) -> float | None:
    """When (monotonic) all 10 of bob's requests were in the requests topic."""
    consumer = reader(config, config.kafka.requests_topic)
    seen: set[bytes] = set()
    try:
        while time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.05):
                key = m.key() or b""
                if m.error() is None and key.startswith(b"bob-"):
                    seen.add(key)
            if len(seen) == 10:
                return time.monotonic()
    finally:
        consumer.close()
    return None


def arm(
    bootstrap: str, chunked: bool, total: int, open_s: float, bob_at_s: float
) -> dict[str, Any]:
    base = fresh_config(bootstrap)
    config = replace(base, scheduling=replace(base.scheduling, fair=True))
    standin = DemandStandin(config, 200_000).__enter__()  # no worker: credit aside
    patch = pytest.MonkeyPatch()
    if not chunked:  # the client has no transactional pending publish since issue 49
        raise ValueError("the one-transaction arm is the recorded figure of issue 38")
    patch.setattr(client_module, "iter_file", _paced_file(open_s, total))
    feeder = Feeder(config, CollectorRegistry())
    try:
        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "alice.jsonl"
            big.write_text("".join(json.dumps(line) + "\n" for line in lines("alice", total)))
            Client(config).submit(lines("warm", 1), key="warm")
            feeder.start()
            alice_done: list[float] = []

            def alice() -> None:
                Client(config).publish_file(big, total, None, {"echo"}, key="alice")
                alice_done.append(time.monotonic())

            started = time.monotonic()
            thread = threading.Thread(target=alice)
            thread.start()
            time.sleep(max(0.0, started + bob_at_s - time.monotonic()))
            Client(config).submit(lines("bob", 10), key="bob")
            committed = time.monotonic()
            fed = _bob_fed(config, committed + open_s * 3)
            thread.join(open_s * 5)
    finally:
        patch.undo()
        feeder.stop()
        standin.__exit__()
    return {
        "publish": "no transaction + end marker" if chunked else "one transaction",
        "bob_committed_at_s": round(committed - started, 2),
        "alice_published_at_s": round(alice_done[0] - started, 2) if alice_done else None,
        "bob_delay_s": round(fed - committed, 2) if fed is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--open-s", type=float, default=60.0)
    parser.add_argument("--bob-at-s", type=float, default=20.0)
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        arms = [
            arm(broker.bootstrap, chunked, args.lines, args.open_s, args.bob_at_s)
            for chunked in (True,)
        ]
    result = {
        "lines": args.lines,
        "open_s": args.open_s,
        "bob_at_s": args.bob_at_s,
        "goal": "bob's delay <= 2 s with chunks",
        "arms": arms,
    }
    print(write_result("feeder_open_upload", result).read_text())


if __name__ == "__main__":
    main()
