"""The remote engine (``engine.kind: openai``) in front of a paced OpenAI-compatible server.

The server is the stand-in (``bench/openai_standin.py``) in a process of its own, paced
like a step-scheduled model: a decoding step costs ``token_s + per_seq_s × running`` and
at most ``max_running`` sequences run, the rest queue. Two figures, each side by side in
one run:

1. **Throughput**: the same server driven directly by an asyncio client at several fixed
   concurrencies (the best one is the reference), then through batchpipe — a batch
   submitted to the embedded broker and collected, one worker with the remote engine at
   its defaults (AIMD, slow start). Ratio: batchpipe's requests/s ÷ the best client's.
2. **Co-existence** (the shape of llm-d's batch-gateway benchmark): interactive clients
   in bursts and idle phases; the interactive latency alone, then with a large batch on
   top through batchpipe with AIMD and the server's queue gate (``metrics_url``), then
   with a fixed window and no gate — the damage for comparison. Reported: interactive
   P50/P99 and their ratio to alone, and the batch's answers per second in the idle and
   in the burst phases.
3. **Tiers** (``--tiers``, issue 50; ``bench/results/remote_flex.json``): the same
   interactive pattern alone, then on top of a default-tier batch and of a flex-tier
   batch, both with fair share on and the remote engine at its defaults (AIMD, the
   queue gate at ``max_waiting`` 0, ``flex_quiet_ms`` 2000): how much sooner flex gives
   way, and what it costs the batch.

    .venv/bin/python -m bench.remote [--quick] [--tiers]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx

from batcher.tiers import DEFAULT
from batchpipe import Client
from bench.common import fresh_config, write_result
from bench.wire import percentile
from tests.integration.harness import running_worker
from worker.config import Config, RemoteConfig
from worker.engines.remote.gate import waiting
from worker.kafka.broker import EmbeddedBroker, free_port

MODEL = "standin"


@dataclass(frozen=True)
class Setup:
    token_s: float = 0.02
    per_seq_s: float = 0.0002
    max_running: int = 24
    max_tokens: int = 16
    throughput_requests: int = 1500
    direct_requests: int = 600
    concurrencies: tuple[int, ...] = (8, 16, 24, 48)
    interactive_clients: int = 6
    burst_s: float = 6.0
    idle_s: float = 6.0
    cycles: int = 3
    batch_requests: int = 4000
    worker_max_concurrency: int = 48


@contextmanager
def standin(setup: Setup) -> Iterator[str]:
    """The stand-in server in a process of its own; yields its base URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "bench.openai_standin",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--token-s",
        str(setup.token_s),
        "--per-seq-s",
        str(setup.per_seq_s),
        "--max-running",
        str(setup.max_running),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the stand-in did not start")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(10)


def body(i: int, max_tokens: int) -> dict[str, Any]:
    words = " ".join(f"w{i}-{j}" for j in range(max_tokens + 4))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": max_tokens,
    }


async def direct(base: str, concurrency: int, n: int, max_tokens: int) -> float:
    """Requests/s of ``n`` chat requests at a fixed ``concurrency``."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        base_url=base, timeout=120, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def one(i: int) -> None:
            async with semaphore:
                response = await client.post("/chat/completions", json=body(i, max_tokens))
                response.raise_for_status()

        start = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.monotonic() - start)


def remote_config(bootstrap: str, base: str, setup: Setup, **remote: Any) -> Config:
    width = setup.worker_max_concurrency
    config = fresh_config(bootstrap, prefetch_count=2 * width, max_batch_size=width)
    settings = replace(
        RemoteConfig(), base_url=base, allow_private=True, max_concurrency=width, **remote
    )
    return replace(
        config, engine=replace(config.engine, kind="openai", model=MODEL, remote=settings)
    )


def lines(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body(i, max_tokens),
        }
        for i in range(n)
    ]


def through_batchpipe(bootstrap: str, base: str, setup: Setup) -> float:
    """Requests/s of one batch, submit to the last answer collected, the worker warm."""
    config = remote_config(bootstrap, base, setup)
    client = Client(config)
    with running_worker(config):
        warm = client.submit(lines(setup.worker_max_concurrency, setup.max_tokens))
        for _ in client.results(warm.batch_id, timeout_s=300):
            pass
        start = time.monotonic()
        receipt = client.submit(lines(setup.throughput_requests, setup.max_tokens))
        for _ in client.results(receipt.batch_id, timeout_s=900):
            pass
        return setup.throughput_requests / (time.monotonic() - start)


async def interactive(base: str, setup: Setup) -> dict[str, Any]:
    """Closed-loop interactive clients in bursts; each phase's latencies and the server's
    completed count at every phase boundary (for the batch's progress)."""
    latencies: list[float] = []
    boundaries: list[tuple[str, float, int]] = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def batch_done() -> int:
            """The server's completions that were not interactive ones: the batch's."""
            text = (await client.get(base.removesuffix("/v1") + "/metrics")).text
            return (waiting(text, "standin_completed_total") or 0) - len(latencies)

        async def user(until: float, k: int) -> None:
            while time.monotonic() < until:
                t = time.monotonic()
                r = await client.post("/chat/completions", json=body(k, setup.max_tokens))
                r.raise_for_status()
                latencies.append(time.monotonic() - t)

        for _ in range(setup.cycles):
            boundaries.append(("burst", time.monotonic(), await batch_done()))
            until = time.monotonic() + setup.burst_s
            await asyncio.gather(*(user(until, k) for k in range(setup.interactive_clients)))
            boundaries.append(("idle", time.monotonic(), await batch_done()))
            await asyncio.sleep(setup.idle_s)
        boundaries.append(("end", time.monotonic(), await batch_done()))
    return {"latencies": latencies, "boundaries": boundaries}


def coexist(
    bootstrap: str, setup: Setup, batch: dict[str, Any] | None, tier: str | None = None
) -> dict[str, Any]:
    """The interactive pattern alone (``batch`` None) or on top of a batch run with the
    remote settings ``batch`` (a ``tier``: with fair share on, the batch in that tier)."""
    with standin(setup) as base:
        if batch is None:
            run = asyncio.run(interactive(base, setup))
        else:
            if batch.get("metrics_url") == "":
                batch = {**batch, "metrics_url": base.removesuffix("/v1") + "/metrics"}
            config = remote_config(bootstrap, base, setup, **batch)
            if tier is not None:
                config = replace(config, scheduling=replace(config.scheduling, fair=True))
            client = Client(config)
            with running_worker(config):
                client.submit(lines(setup.batch_requests, setup.max_tokens), tier=tier or DEFAULT)
                time.sleep(setup.idle_s)  # the batch gets going before the first burst
                run = asyncio.run(interactive(base, setup))
    latencies = run["latencies"]
    row: dict[str, Any] = {
        "interactive_requests": len(latencies),
        "interactive_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "interactive_p99_ms": round(percentile(latencies, 99) * 1000, 1),
    }
    if batch is not None:
        row["batch_per_s"] = batch_rates(run["boundaries"])
    return row


def batch_rates(boundaries: list[tuple[str, float, int]]) -> dict[str, float]:
    """Batch answers/s in the burst and the idle phases, from the batch's completions
    counted at each phase boundary."""
    spent = {"burst": 0.0, "idle": 0.0}
    done = {"burst": 0.0, "idle": 0.0}
    for (phase, t0, c0), (_, t1, c1) in itertools.pairwise(boundaries):
        spent[phase] += t1 - t0
        done[phase] += c1 - c0
    return {phase: round(max(0.0, done[phase]) / spent[phase], 1) for phase in spent}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter phases")
    parser.add_argument(
        "--tiers",
        action="store_true",
        help="only the tiers figure: interactive alone, beside a default and a flex batch",
    )
    args = parser.parse_args(argv)
    setup = Setup()
    if args.quick:
        setup = replace(
            setup,
            throughput_requests=300,
            direct_requests=200,
            burst_s=3.0,
            idle_s=3.0,
            cycles=2,
            batch_requests=1500,
        )
    if args.tiers:
        return tiers(setup)
    with EmbeddedBroker() as broker:
        with standin(setup) as base:
            rates = {
                c: round(asyncio.run(direct(base, c, setup.direct_requests, setup.max_tokens)), 1)
                for c in setup.concurrencies
            }
            best = max(rates.values())
            piped = round(through_batchpipe(broker.bootstrap, base, setup), 1)
        alone = coexist(broker.bootstrap, setup, None)
        aimd = coexist(
            broker.bootstrap,
            setup,
            {"adaptive": True, "metrics_url": "", "metrics_interval_ms": 100},
        )
        fixed = coexist(broker.bootstrap, setup, {"adaptive": False})
    for row in (aimd, fixed):
        row["p99_vs_alone"] = round(row["interactive_p99_ms"] / alone["interactive_p99_ms"], 2)
    payload = {
        "setup": setup.__dict__ | {"concurrencies": list(setup.concurrencies)},
        "throughput": {
            "direct_requests_per_s": {str(c): r for c, r in rates.items()},
            "best_direct_requests_per_s": best,
            "batchpipe_requests_per_s": piped,
            "batchpipe_vs_best_direct": round(piped / best, 3),
        },
        "coexist": {"alone": alone, "aimd": aimd, "fixed": fixed},
    }
    write_result("remote", payload)
    print(payload)
    return payload


def tiers(setup: Setup) -> dict[str, Any]:
    """Interactive traffic alone, beside a default-tier and beside a flex-tier batch."""
    gate = {"metrics_url": "", "metrics_interval_ms": 100}
    with EmbeddedBroker() as broker:
        alone = coexist(broker.bootstrap, setup, None)
        rows = {tier: coexist(broker.bootstrap, setup, gate, tier) for tier in ("default", "flex")}
    for row in rows.values():
        row["p99_vs_alone"] = round(row["interactive_p99_ms"] / alone["interactive_p99_ms"], 2)
        row["p50_vs_alone"] = round(row["interactive_p50_ms"] / alone["interactive_p50_ms"], 2)
    payload = {
        "setup": setup.__dict__ | {"concurrencies": list(setup.concurrencies)},
        "remote": {**gate, "flex_quiet_ms": RemoteConfig().flex_quiet_ms, "max_waiting": 0},
        "coexist": {"alone": alone, **rows},
    }
    write_result("remote_flex", payload)
    print(payload)
    return payload


if __name__ == "__main__":
    main()
