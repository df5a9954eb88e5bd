"""Latency at light load: how long a request waits when the worker is far from full.

For each engine feeding mode (echo static, echo in flight, both paced at
``simulated_token_s`` per decoding step and ``max_tokens`` 4, so a batch takes about
40 ms) and each count of assigned partitions (1, 6, 64), in one run:

1. **capacity**: a backlog of requests is published and the worker's answer rate while it
   drains is the capacity (requests/s) of that configuration;
2. **offered load**: JSON batch lines at a steady rate — half and one tenth of that
   capacity — keyed over every partition, for ``--seconds`` each.

A reader assigned to every results partition (read_committed, as ``collect`` reads) notes
when each answer becomes visible. Reported per load: end-to-end P50/P90/P99 (produce →
visible to that reader) and the results' own stage timings (``queued_s``,
``batch_wait_s``, ``engine_s``), with the goals of issue 29:

* P99 of ``batch_wait_s`` ≤ ``timeout_ms`` + 20 ms;
* end-to-end P99 ≤ ``timeout_ms`` + 1.2 × engine batch time (the P50 of ``engine_s``) +
  ``commit_interval_ms`` + 50 ms.

With ``--mixed`` every tenth request offered asks for :data:`LONG_TOKENS` tokens (a
second of decoding steps) instead of :data:`MAX_TOKENS`, and the figures are given for the
short requests too (``short``): how long an answer waits when longer ones run ahead of it
in its partition (issue 48); written to ``latency_mixed.json``.

    .venv/bin/python -m bench.latency [--seconds S] [--partitions 1,6,64] [--mixed]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from msgspec import structs

from bench.common import fresh_config, write_result
from bench.wire import json_request, summary_requests
from tests.integration.harness import reader, running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.wire.codec import decode_result
from worker.wire.messages import InferenceRequest, SamplingParams, Timings

STEP_S = 0.01
MAX_TOKENS = 4
#: --mixed: every LONG_EVERY-th request asks for LONG_TOKENS tokens
LONG_EVERY = 10
LONG_TOKENS = 100
CAPACITY_REQUESTS = 1_500
LOADS = (0.5, 0.1)
MODES = ("static", "in_flight")


@dataclass
class Seen:
    """Answers as they became visible: custom_id → (wall time, the result's timings)."""

    answers: dict[str, tuple[float, Timings]]
    lock: threading.Lock


def read_answers(config: Config, seen: Seen, stop: threading.Event) -> None:
    consumer = reader(config, config.kafka.results_topic)
    try:
        while not stop.is_set():
            for m in consumer.consume(500, timeout=0.05):
                if m.error() is not None:
                    continue
                now = time.time()
                result = decode_result(m.value(), m.headers())
                with seen.lock:
                    seen.answers.setdefault(result.custom_id, (now, result.timings))
    finally:
        consumer.close()


def wait_for(seen: Seen, ids: Sequence[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with seen.lock:
            if all(i in seen.answers for i in ids):
                return
        time.sleep(0.05)
    raise RuntimeError(f"not every one of {len(ids)} requests was answered in {timeout_s} s")


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {"p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99)}


class Offered:
    """Publishes requests of one phase (ids ``<phase>-<i>``), noting when each was sent."""

    def __init__(self, config: Config, mixed: bool = False) -> None:
        self.config = config
        self.producer = clients.producer(config.kafka, extra={"linger.ms": 0})
        self.sent: dict[str, float] = {}
        self.mixed = mixed  # every LONG_EVERY-th request long
        self.long: set[str] = set()

    def publish(self, phase: str, count: int, rate: float | None) -> list[str]:
        requests = summary_requests(count, MAX_TOKENS)
        ids, start = [], time.time()
        for i, request in enumerate(requests):
            if rate is not None:
                time.sleep(max(0.0, start + i / rate - time.time()))
            request = structs.replace(request, custom_id=f"{phase}-{i}")
            if self.mixed and i % LONG_EVERY == LONG_EVERY - 1:
                sampling = structs.replace(request.sampling, max_tokens=LONG_TOKENS)
                request = structs.replace(request, sampling=sampling)
                self.long.add(request.custom_id)
            ids.append(self._send(request))
        self.producer.flush(30)
        return ids

    def publish_long(self, custom_id: str, tokens: int) -> str:
        """One request whose answer takes ``tokens`` decoding steps: the echo engines'
        tokens are the prompt's bytes, echoed up to ``max_tokens``."""
        sampling = SamplingParams(max_tokens=tokens, temperature=0.0)
        request = InferenceRequest(custom_id=custom_id, prompt="x" * tokens, sampling=sampling)
        self._send(request)
        self.producer.flush(30)
        return custom_id

    def _send(self, request: InferenceRequest) -> str:
        value, raw = json_request(request)
        headers: list[tuple[str, str | bytes | None]] = [*raw]
        self.sent[request.custom_id] = time.time()
        key = request.custom_id.encode()
        self.producer.produce(self.config.kafka.requests_topic, value, key, headers=headers)
        self.producer.poll(0)
        return request.custom_id


def _config(bootstrap: str, mode: str, partitions: int) -> Config:
    config = fresh_config(bootstrap, max_batch_tokens=4 * 8192)
    engine = EngineConfig(kind="echo", echo_mode=mode, simulated_token_s=STEP_S)  # type: ignore[arg-type]
    kafka = replace(config.kafka, partitions=partitions)
    generation = replace(config.generation, max_tokens=MAX_TOKENS)
    return replace(config, engine=engine, kafka=kafka, generation=generation)


def measure(
    bootstrap: str, mode: str, partitions: int, seconds: float, mixed: bool = False
) -> dict[str, Any]:
    config = _config(bootstrap, mode, partitions)
    k = config.kafka
    clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
    seen = Seen({}, threading.Lock())
    stop = threading.Event()
    reading = threading.Thread(target=read_answers, args=(config, seen, stop), daemon=True)
    reading.start()
    offered = Offered(config, mixed)
    row: dict[str, Any] = {"engine": f"echo {mode}", "partitions": partitions}
    try:
        with running_worker(config):
            # warm: the group joined and one request answered before anything is timed
            wait_for(seen, offered.publish("warm", 1, None), 120)
            ids = offered.publish("capacity", CAPACITY_REQUESTS, None)
            wait_for(seen, ids, 300)
            with seen.lock:
                times = [seen.answers[i][0] for i in ids]
            capacity = len(ids) / (max(times) - min(offered.sent[i] for i in ids))
            row["capacity_requests_per_s"] = round(capacity, 1)
            row["loads"] = []
            for load in LOADS:
                rate = load * capacity
                phase = f"load{load}"
                ids = offered.publish(phase, max(20, int(rate * seconds)), rate)
                wait_for(seen, ids, 120)
                figures = _figures(config, seen, offered, ids, load, rate)
                if mixed:
                    short = [i for i in ids if i not in offered.long]
                    figures["short"] = _figures(config, seen, offered, short, load, rate)
                row["loads"].append(figures)
    finally:
        stop.set()
        reading.join(10)
    return row


def _figures(
    config: Config, seen: Seen, offered: Offered, ids: Sequence[str], load: float, rate: float
) -> dict[str, Any]:
    with seen.lock:
        answers = [seen.answers[i] for i in ids]
    e2e = [at - offered.sent[i] for i, (at, _) in zip(ids, answers, strict=True)]
    timings = [t for _, t in answers]
    engine = _percentiles([t.engine_s for t in timings])
    batch_wait = _percentiles([t.batch_wait_s for t in timings])
    end_to_end = _percentiles(e2e)
    timeout_ms = config.batching.timeout_ms
    e2e_goal = timeout_ms + 1.2 * engine["p50_ms"] + config.kafka.commit_interval_ms + 50
    return {
        "load": load,
        "offered_requests_per_s": round(rate, 1),
        "requests": len(ids),
        "end_to_end": end_to_end,
        "queued": _percentiles([t.queued_s for t in timings]),
        "batch_wait": batch_wait,
        "engine": engine,
        "goal_batch_wait_p99_ms": timeout_ms + 20,
        "goal_end_to_end_p99_ms": round(e2e_goal, 1),
        "meets_goals": batch_wait["p99_ms"] <= timeout_ms + 20 and end_to_end["p99_ms"] <= e2e_goal,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per offered load")
    parser.add_argument("--partitions", default="1,6,64")
    parser.add_argument(
        "--mixed", action="store_true", help=f"every {LONG_EVERY}th request {LONG_TOKENS} tokens"
    )
    args = parser.parse_args(argv)
    counts = [int(p) for p in args.partitions.split(",")]
    rows = []
    with EmbeddedBroker() as broker:
        for mode in MODES:
            for partitions in counts:
                row = measure(broker.bootstrap, mode, partitions, args.seconds, args.mixed)
                print(row, flush=True)
                rows.append(row)
    defaults = Config()
    payload = {
        "setup": {
            "step_s": STEP_S,
            "max_tokens": MAX_TOKENS,
            "timeout_ms": defaults.batching.timeout_ms,
            "commit_interval_ms": defaults.kafka.commit_interval_ms,
            "seconds_per_load": args.seconds,
            "capacity_requests": CAPACITY_REQUESTS,
            "mixed": {"long_every": LONG_EVERY, "long_tokens": LONG_TOKENS} if args.mixed else None,
        },
        "runs": rows,
        "all_meet_goals": all(load["meets_goals"] for row in rows for load in row["loads"]),
    }
    write_result("latency_mixed" if args.mixed else "latency", payload)
    return payload


if __name__ == "__main__":
    main()
