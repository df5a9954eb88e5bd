"""How publishers hide each other's batches, and what ``submit`` costs (issue 49).

Three parts, each on a fresh embedded broker (Tansu, memory only):

* ``pairs``: ``--at-once`` one-shot producers (2) committing at the same moment to one
  partition, ``--pairs`` times over (45 records each), as transactional producers (one
  ``transactional.id`` each, as a ``submit`` had) and as idempotent producers without a
  transaction (as they publish now): how many of the records sent a ``read_committed``
  reader reads within 10 s.
* ``killed``: a publisher process SIGKILLed after 2,000 records, then a 20-record batch
  published by another: when its 20 records are readable ``read_committed`` (10 s at
  most), for both kinds of publisher.
* ``throughput``: lines a second of ``Client.submit_file`` (fair share on, the defaults,
  and ``scheduling.fair: false``) on one file of ``--lines`` lines, each build a source
  tree (``--tree NAME=DIR``, ``.`` is this checkout), each in a process of its own with
  the tree first on ``PYTHONPATH``; the order rotates from round to round, medians over
  ``--rounds``.

    .venv/bin/python -m bench.publish [--tree NAME=DIR ...] [--lines 200000] [--rounds 3]
        [--pairs 25] [--at-once 2] [--only pairs,killed,throughput]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.common import write_result
from worker.kafka.broker import EmbeddedBroker

PER_PRODUCER = 45
READ_S = 10.0


def _producer(bootstrap: str, transactional: bool) -> Producer:
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "log_level": 0,
    }
    if transactional:
        settings["transactional.id"] = f"bench-{uuid.uuid4().hex}"
    return Producer(settings)


def _topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    name = f"bench-publish-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result(30)
    return name


def _readable(bootstrap: str, topic: str, expected: int, timeout_s: float) -> tuple[int, float]:
    """How many records a read_committed reader of ``topic`` reads within ``timeout_s``,
    and when (seconds) it had read the last of them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 25,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    started = time.monotonic()
    seen, last = 0, 0.0
    try:
        while seen < expected and time.monotonic() - started < timeout_s:
            for m in consumer.consume(1000, timeout=0.1):
                if m.error() is None:
                    seen += 1
                    last = time.monotonic() - started
    finally:
        consumer.close()
    return seen, last


def _one_shot(bootstrap: str, topic: str, transactional: bool, gate: threading.Barrier) -> None:
    producer = _producer(bootstrap, transactional)
    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for i in range(PER_PRODUCER):
        producer.produce(topic, value=b"x" * 100, key=str(i).encode())
    producer.flush(30) if not transactional else None
    gate.wait(30)  # both commit at the same moment
    if transactional:
        producer.commit_transaction(30)
    else:
        producer.flush(30)


def pairs(count: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "groups": count,
        "producers_at_once": size,
        "records_per_producer": PER_PRODUCER,
    }
    for kind, transactional in (("transactional", True), ("idempotent", False)):
        with EmbeddedBroker() as broker:
            topic = _topic(broker.bootstrap)
            for _ in range(count):
                gate = threading.Barrier(size)
                threads = [
                    threading.Thread(
                        target=_one_shot, args=(broker.bootstrap, topic, transactional, gate)
                    )
                    for _ in range(size)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
            sent = size * count * PER_PRODUCER
            read, _ = _readable(broker.bootstrap, topic, sent, READ_S)
        out[kind] = {"sent": sent, "read_committed": read}
        print(f"pairs {kind}: {read} of {sent} readable", flush=True)
    return out


_KILLED = """
import sys, time
from confluent_kafka import Producer
bootstrap, topic, transactional = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
settings = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "log_level": 0}
if transactional:
    settings["transactional.id"] = "bench-killed-" + str(time.time())
p = Producer(settings)
if transactional:
    p.init_transactions(30)
    p.begin_transaction()
for i in range(2000):
    p.produce(topic, value=b"y" * 100)
p.flush(30)
print("written", flush=True)
time.sleep(600)
"""


def killed() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, transactional in (("transactional", True), ("idempotent", False)):
        with EmbeddedBroker() as broker:
            topic = _topic(broker.bootstrap)
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _KILLED,
                    broker.bootstrap,
                    topic,
                    "1" if transactional else "0",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "written"
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            producer = _producer(broker.bootstrap, transactional)
            if transactional:
                producer.init_transactions(30)
                producer.begin_transaction()
            for i in range(20):
                producer.produce(topic, value=b"z" * 100, key=str(i).encode())
            if transactional:
                producer.commit_transaction(30)
            else:
                producer.flush(30)
            read, when = _readable(broker.bootstrap, topic, 2000 + 20, READ_S)
        out[kind] = {
            "killed_records": 2000,
            "batch_records": 20,
            "read_committed": read,
            "batch_readable": read >= 2020 or (not transactional and read >= 20),
            "seconds": round(when, 3) if read else None,
        }
        print(f"killed {kind}: {read} readable within {READ_S:g} s", flush=True)
    return out


_SUBMIT = """
import json, sys, time
from dataclasses import replace
from batchpipe.batchfile import FileLimits
from batchpipe.client import Client
from tests.integration.harness import isolated_config
bootstrap, path, fair = sys.argv[1], sys.argv[2], sys.argv[3] == "fair"
config = isolated_config(bootstrap, prefix="bench")
config = replace(config, scheduling=replace(config.scheduling, fair=fair))
client = Client(config, limits=FileLimits(max_lines=10**7))
started = time.perf_counter()
receipt = client.submit_file(path)
print(json.dumps({"seconds": time.perf_counter() - started, "total": receipt.total}))
"""


def _file(lines: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix="bench-publish-")) / "batch.jsonl"
    with path.open("w") as f:
        for i in range(lines):
            row = {
                "custom_id": f"r-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "echo", "messages": [{"role": "user", "content": f"line {i}"}]},
            }
            f.write(json.dumps(row) + "\n")
    return path


MODES = ("fair", "direct")


def throughput(trees: list[tuple[str, Path]], lines: int, rounds: int) -> dict[str, Any]:
    path = _file(lines)
    runs = [(f"{name} {mode}", tree, mode) for name, tree in trees for mode in MODES]
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for r in range(rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        with EmbeddedBroker() as broker:
            for name, tree, mode in order:
                env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHPIPE_")}
                env["PYTHONPATH"] = str(tree)
                done = subprocess.run(
                    [sys.executable, "-c", _SUBMIT, broker.bootstrap, str(path), mode],
                    capture_output=True,
                    text=True,
                    cwd=tree,
                    env=env,
                    timeout=900,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"{name}: {done.stderr[-2000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                assert row["total"] == lines
                seconds[name].append(row["seconds"])
                print(f"round {r} {name}: {lines / row['seconds']:,.0f} lines/s", flush=True)
    out: dict[str, Any] = {"lines": lines, "rounds": rounds, "builds": {}}
    for name, _, _ in runs:
        median = statistics.median(seconds[name])
        out["builds"][name] = {
            "seconds": [round(s, 3) for s in seconds[name]],
            "lines_per_s": round(lines / median),
        }
    base = trees[0][0]
    for name, _, mode in runs:  # each build against the first, mode by mode
        first = out["builds"][f"{base} {mode}"]["lines_per_s"]
        out["builds"][name]["vs_" + base] = round(out["builds"][name]["lines_per_s"] / first, 3)
    path.unlink()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR")
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=25, help="groups of producers")
    parser.add_argument("--at-once", type=int, default=2, help="producers in a group")
    parser.add_argument("--only", default="pairs,killed,throughput")
    args = parser.parse_args()
    only = set(args.only.split(","))
    trees = [(name, Path(d).resolve()) for name, d in (t.split("=", 1) for t in args.tree)] or [
        ("this", Path(".").resolve())
    ]
    payload: dict[str, Any] = {
        "question": "how publishers hide each other's batches on the embedded broker, "
        "and submit's lines a second (issue 49)",
        "setup": f"embedded Tansu; pairs: {args.pairs} groups of {args.at_once} one-shot "
        "producers, "
        f"{PER_PRODUCER} records each; killed: 2,000 records then SIGKILL, then 20; "
        f"throughput: Client.submit_file of {args.lines:,} echo lines, fair share on and off, "
        f"{args.rounds} rotating rounds, medians",
    }
    if "pairs" in only:
        payload["pairs"] = pairs(args.pairs, args.at_once)
    if "killed" in only:
        payload["killed"] = killed()
    if "throughput" in only:
        payload["throughput"] = throughput(trees, args.lines, args.rounds)
    print(write_result("publish", payload))


if __name__ == "__main__":
    main()
