"""In flight vs static batches: the same requests through the worker, side by side.

The same seeded requests go through a full worker on the embedded broker (decode, batcher,
engine, encode, produce, commit) to the same engine's step-time, fed two ways, one after
the other in one run:

* (i) ``static``: one batch at a time — the worker's static stage hands over up to
  ``max_batch_size`` requests and forms the next batch only when the last of them
  finished;
* (ii) ``in_flight``: the worker's in-flight stage submits a request whenever a sequence
  slot frees, up to ``max_batch_size`` in flight.

Engines:

* ``echo`` (always): a GPU-shaped step-time model, every decoding step making one token
  for each sequence in it and costing ``a + b × sequences in the step`` (:data:`STEP_S`,
  :data:`PER_SEQ_S`: an assumed shape, not a measured GPU), batch 64, ``max_tokens``
  16–512, each request generating exactly its ``max_tokens``. (ii) is
  :class:`EchoInFlightEngine`: a step holds the sequences still running. (i) is the static
  :class:`EchoEngine` with the same ``a`` and ``b``: static batching as HF ``generate``,
  padded batches or TensorRT-LLM's static batching do it — every row of a batch stays in
  every step until the longest row ends, so each of its ``max(max_tokens)`` steps costs
  ``a + b × rows in the batch``. 1024 requests: a finite job ends with a drain (the last
  requests finishing one by one, slots emptying), a smaller share of a longer run.
* ``vllm`` (``--engine vllm``): the default model on the CPU, ≥ 192 chat requests,
  prompts 10–600 words, ``max_tokens`` 8–256, greedy. (i) is the vLLM engine itself fed one
  batch at a time (:class:`OneBatchAtATime`): its finished sequences leave the batch, but
  nothing joins it.

Both run twice: with the default formation (length-aware + shared prefix: a static batch
takes requests of similar length, which shortens its tail) and with FIFO formation
(``*_fifo``), the arms alternating (static, in flight, static FIFO, in flight FIFO), after
one unmeasured static FIFO arm on a model engine (``warm_up_seconds``). Per
mode: requests/s, generated tokens/s, end-to-end P50/P99 (all requests published at once,
as an offline job, until the reader received each answer), and how idle the engine was,
from the results' own timings: ``engine_idle_fraction`` (share of the run with no request
on the engine) and ``slot_idle_fraction`` (share of the ``max_batch_size`` sequence slots
not running an unfinished request, time-averaged: a padded row that has finished counts as
idle). For echo, ``in_flight_bound`` is the step model alone with an instant feeder (every
freed slot refilled before the next step, requests in arrival order, no Kafka): the best
(ii) can reach on this workload; its idle slots are the drain's.

Last, the RSS check: a worker process with the in-flight echo engine under a 10,000-request
backlog; its resident memory, sampled while the backlog drains, stays flat because
``prefetch_count`` bounds what it holds.

Each engine's section of ``bench/results/inflight.json`` is replaced when it runs; the
others are kept.

    .venv/bin/python -m bench.inflight [--engine echo|vllm] [--requests N] [--skip-rss]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import tempfile
import time
import urllib.request
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from msgspec import structs

from bench.common import RESULTS, fresh_config, machine, worker_thread, write_result
from bench.wire import ResultReader, percentile, prompt_fetch, timestamped
from tests.integration.harness import (
    ResultWatcher,
    publish,
    start_worker_process,
    write_config,
)
from worker.config import BatchingConfig, Config, load_config
from worker.engines.base import (
    Capacity,
    Completion,
    Engine,
    EngineInput,
    InFlightEngine,
    OnComplete,
    StaticEngine,
)
from worker.engines.echo import EchoEngine
from worker.engines.echo_inflight import EchoInFlightEngine
from worker.engines.factory import create_engine
from worker.kafka.broker import EmbeddedBroker
from worker.wire.messages import ChatMessage, InferenceRequest, InferenceResult, SamplingParams

STEP_S = 0.007  # a: the fixed cost of a decoding step (reading the weights)
PER_SEQ_S = 0.00005  # b: what each running sequence adds to a step
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "batches")
#: per engine: requests, batch size, max_tokens range, prompt length range (words)
WORKLOADS: dict[str, dict[str, Any]] = {
    "echo": {"requests": 1024, "batch": 64, "max_tokens": (16, 512)},
    "vllm": {"requests": 192, "batch": 32, "max_tokens": (8, 256), "prompt_words": (10, 600)},
}
RSS_REQUESTS = 10_000


class OneBatchAtATime(StaticEngine):
    """An in-flight engine fed as a static one (vllm's arm (i)): ``run_batch`` submits
    every input and returns when the last one completed, so nothing joins a batch while it runs.
    ``load`` and ``close`` are left to the owner: one engine serves several runs."""

    def __init__(self, engine: InFlightEngine) -> None:
        self.engine = engine
        self.model_name = engine.model_name

    def load(self) -> None:
        """Loaded by the owner."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return self.engine.encode(request)

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        for item in inputs:
            self.engine.submit(item)
        pending = {item.key for item in inputs}
        while pending:
            for completion in self.engine.completions(timeout_s=0.05):
                pending.discard(completion.key)
                on_complete(completion)

    def utilization(self) -> float:
        return self.engine.utilization()


class Borrowed(InFlightEngine):
    """An in-flight engine lent to one worker: everything but ``load`` and ``close``."""

    def __init__(self, engine: InFlightEngine) -> None:
        self.engine = engine
        self.model_name = engine.model_name

    def load(self) -> None:
        """Loaded by the owner."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return self.engine.encode(request)

    def submit(self, item: EngineInput) -> None:
        self.engine.submit(item)

    def abort(self, keys: Collection[str]) -> None:
        self.engine.abort(keys)

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        return self.engine.completions(timeout_s)

    def capacity(self) -> Capacity:
        return self.engine.capacity()

    def utilization(self) -> float:
        return self.engine.utilization()


def workload(kind: str, n: int, seed: int = 11) -> list[InferenceRequest]:
    """``n`` seeded chat requests for ``kind``.

    echo answers with the user message, so each message is at least ``max_tokens`` long
    and every request generates exactly its ``max_tokens``.
    """
    rng = random.Random(seed)
    spec = WORKLOADS[kind]
    requests = []
    for i in range(n):
        max_tokens = rng.randint(*spec["max_tokens"])
        if kind == "echo":
            text = " ".join(rng.choices(WORDS, k=max_tokens // 3 + rng.randint(4, 40)))
        else:
            text = " ".join(rng.choices(WORDS, k=rng.randint(*spec["prompt_words"])))
        requests.append(
            InferenceRequest(
                custom_id=f"{kind}-{i}",
                messages=(ChatMessage("user", text),),
                sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            )
        )
    return requests


def batching(kind: str) -> BatchingConfig:
    batch = WORKLOADS[kind]["batch"]
    # sequences bind, not tokens: the token budget holds a full batch of the longest requests
    return BatchingConfig(
        prefetch_count=2 * batch,
        max_batch_size=batch,
        max_batch_tokens=batch * 2048,
        adaptive=False,
    )


def idle_fractions(
    results: Sequence[InferenceResult], start: float, end: float, slots: int
) -> dict[str, float]:
    """How idle the engine was over [start, end], from each result's engine interval."""
    spans = sorted((r.created_at - r.timings.engine_s, r.created_at) for r in results)
    busy, reach = 0.0, start
    for lo, hi in spans:
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            busy += hi - lo
            reach = hi
    occupied = sum(r.timings.engine_s for r in results)
    wall = end - start
    return {
        "engine_idle_fraction": round(1 - busy / wall, 3),
        "slot_idle_fraction": round(1 - occupied / (slots * wall), 3),
    }


def in_flight_bound(max_tokens: Sequence[int], slots: int) -> dict[str, float]:
    """The echo step model fed by an instant feeder: each freed slot refilled before the
    next step, requests in arrival order, no worker, no Kafka — the best the in-flight arm
    can reach on this workload. Its idle slots are the drain's: once nothing is left to
    start, the last requests finish one by one."""
    pending = iter(max_tokens)
    running: list[int] = []  # tokens left of each running sequence
    seconds = 0.0
    occupied = steps = 0
    while True:
        running += [left for _, left in zip(range(slots - len(running)), pending, strict=False)]
        if not running:
            break
        seconds += STEP_S + PER_SEQ_S * len(running)
        occupied += len(running)
        steps += 1
        running = [left - 1 for left in running if left > 1]
    return {
        "seconds": round(seconds, 2),
        "tokens_per_s": round(sum(max_tokens) / seconds, 1),
        "slot_idle_fraction": round(1 - occupied / (slots * steps), 3),
    }


def through_worker(
    broker: EmbeddedBroker, config: Config, engine: Engine, requests: Sequence[InferenceRequest]
) -> dict[str, Any]:
    """``requests`` through a worker fed by ``engine``; figures of the run."""
    config = prompt_fetch(replace(config, kafka=fresh_config(broker.bootstrap).kafka))
    reader = ResultReader(config)
    with worker_thread(config, engine):
        warm = [structs.replace(r, custom_id=f"warm-{r.custom_id}") for r in requests[:2]]
        publish(config, warm)  # the group join stays out of the figures
        reader.wait_for([r.custom_id for r in warm], timeout_s=600)
        t0 = time.time()
        stamped = [timestamped(r) for r in requests]
        publish(config, stamped)
        reader.wait_for([r.custom_id for r in requests], timeout_s=3600)
    reader.close()
    answers = [reader.arrived[r.custom_id] for r in stamped]
    results = [result for _, result in answers]
    assert all(r.status == "completed" for r in results), [r.error for r in results if r.error]
    end = max(arrived for arrived, _ in answers)
    seconds = end - t0
    e2e = [arrived - t0 for arrived, _ in answers]
    tokens = sum(r.usage.completion_tokens for r in results)
    return {
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(results) / seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "completion_tokens": tokens,
        "e2e_p50_s": round(percentile(e2e, 50), 2),
        "e2e_p99_s": round(percentile(e2e, 99), 2),
        **idle_fractions(results, t0, end, config.batching.max_batch_size),
    }


def compare(kind: str, n: int) -> dict[str, Any]:
    """(i) static and (ii) in flight with one ``kind`` engine, side by side."""
    config = replace(load_config(environ={}), batching=batching(kind))
    engine: InFlightEngine
    static: StaticEngine
    if kind == "echo":
        engine = EchoInFlightEngine(
            delay_per_token_s=STEP_S,
            delay_per_seq_token_s=PER_SEQ_S,
            max_sequences=config.batching.max_batch_size,
            max_tokens=config.batching.max_batch_tokens,
        )
        # padded static batching: every row in every step until the batch's longest ends
        static = EchoEngine(delay_per_token_s=STEP_S, delay_per_seq_token_s=PER_SEQ_S)
        config = replace(config, engine=replace(config.engine, kind="echo", model="echo"))
    else:
        config = load_config(sets=[f"engine.kind={kind}"], environ={})
        config = replace(config, batching=batching(kind))
        created = create_engine(config.engine, config.batching)
        if not isinstance(created, InFlightEngine):
            raise SystemExit(f"engine {kind} is not an in-flight engine")
        engine, static = created, OneBatchAtATime(created)
    requests = workload(kind, n)
    started = time.monotonic()
    engine.load()
    load_s = time.monotonic() - started
    fifo = replace(
        config, batching=replace(config.batching, length_aware=False, shared_prefix=False)
    )
    try:
        with EmbeddedBroker() as broker:
            # a model engine runs one unmeasured arm first: on vllm the first arm of a run
            # was about 100 s slower than the same arm run later (FIFO or length-aware
            # alike), which counted against whichever arm went first; the echo step model
            # has nothing to warm
            warm_up = (
                0.0 if kind == "echo" else through_worker(broker, fifo, static, requests)["seconds"]
            )
            modes = {
                "static": through_worker(broker, config, static, requests),
                "in_flight": through_worker(broker, config, Borrowed(engine), requests),
                "static_fifo": through_worker(broker, fifo, static, requests),
                "in_flight_fifo": through_worker(broker, fifo, Borrowed(engine), requests),
            }
    finally:
        engine.close()
    print(kind, modes, flush=True)

    def ratio(key: str, suffix: str = "") -> float:
        rate: float = modes[f"in_flight{suffix}"][key] / modes[f"static{suffix}"][key]
        return round(rate, 2)

    spec = WORKLOADS[kind]
    return {
        "engine": kind,
        "model": engine.model_name,
        "when": machine()["when"],
        "requests": n,
        "max_batch_size": config.batching.max_batch_size,
        "max_tokens": list(spec["max_tokens"]),
        **({"prompt_words": list(spec["prompt_words"])} if "prompt_words" in spec else {}),
        **(
            {
                "step_model": {"a_s": STEP_S, "b_s_per_sequence": PER_SEQ_S},
                "static_feed": "padded batches: each of a batch's max(max_tokens) steps "
                "costs a + b x rows in the batch",
                "in_flight_bound": in_flight_bound(
                    # workload() sets every max_tokens, and echo generates exactly that
                    [r.sampling.max_tokens for r in requests if r.sampling.max_tokens],
                    config.batching.max_batch_size,
                ),
            }
            if kind == "echo"
            else {
                "load_seconds": round(load_s, 1),
                "warm_up_seconds": warm_up,
                "static_feed": "one batch at a time on the in-flight engine: finished "
                "sequences leave, nothing joins",
            }
        ),
        "modes": modes,
        "ratio_requests_per_s": ratio("requests_per_s"),
        "ratio_tokens_per_s": ratio("tokens_per_s"),
        "ratio_tokens_per_s_fifo": ratio("tokens_per_s", "_fifo"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _inflight(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("batchpipe_inflight_requests "):
                return int(float(line.split()[1]))
    return 0


def rss_under_backlog(tmp: Path, n: int = RSS_REQUESTS) -> dict[str, Any]:
    """A worker process (echo in flight) under an ``n``-request backlog: its RSS over time."""
    with EmbeddedBroker() as broker:
        config = fresh_config(broker.bootstrap, **vars(batching("echo")))
        port = _free_port()
        config = replace(
            config,
            engine=replace(
                config.engine,
                kind="echo",
                model="echo",
                echo_mode="in_flight",
                simulated_token_s=0.0005,
                simulated_token_per_seq_s=0.000005,
            ),
            metrics=replace(config.metrics, port=port),
        )
        rng = random.Random(5)
        publish(
            config,
            (
                InferenceRequest(
                    custom_id=f"rss-{i}",
                    messages=(ChatMessage("user", " ".join(rng.choices(WORDS, k=8))),),
                    sampling=SamplingParams(max_tokens=16, temperature=0.0),
                )
                for i in range(n)
            ),
        )
        watcher = ResultWatcher(config)
        process = start_worker_process(write_config(config, tmp / "rss-worker.yaml"))
        samples: list[tuple[float, float, int]] = []  # (seconds, RSS MiB, answered)
        peak_inflight = 0
        started = time.monotonic()
        try:
            while len(watcher.ids) < n and time.monotonic() - started < 900:
                watcher.poll(0.25)
                elapsed = time.monotonic() - started
                samples.append((elapsed, _rss_mib(process.pid), len(watcher.ids)))
                with contextlib.suppress(OSError):  # not serving yet
                    peak_inflight = max(peak_inflight, _inflight(port))
        finally:
            process.terminate()
            process.wait(60)
    # from the first answer on: before it, the process is still importing and joining
    draining = [s for s in samples if s[2] > 0 and s[2] < n]
    rss = [mib for _, mib, _ in draining]
    return {
        "requests": n,
        "answered": len(watcher.ids),
        "prefetch_count": config.batching.prefetch_count,
        "peak_inflight_requests_seen": peak_inflight,
        "rss_mib_first_last_min_max": [
            round(rss[0], 1),
            round(rss[-1], 1),
            round(min(rss), 1),
            round(max(rss), 1),
        ],
        "samples": [[round(t, 2), round(mib, 1), answered] for t, mib, answered in draining],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(WORKLOADS), default="echo")
    parser.add_argument("--requests", type=int, default=0, help="default: per engine")
    parser.add_argument("--skip-rss", action="store_true")
    args = parser.parse_args(argv)
    path = RESULTS / "inflight.json"
    figures: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    figures.pop("machine", None)
    engines = figures.setdefault("engines", {})
    engines[args.engine] = compare(args.engine, args.requests or WORKLOADS[args.engine]["requests"])
    if not args.skip_rss:
        with tempfile.TemporaryDirectory() as tmp:
            figures["rss"] = rss_under_backlog(Path(tmp))
            print("rss", figures["rss"]["rss_mib_first_last_min_max"], flush=True)
    write_result("inflight", figures)
    return figures


if __name__ == "__main__":
    main()
