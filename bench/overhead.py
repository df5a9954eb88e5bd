"""Pipeline overhead: the worker with the echo engine against a raw confluent-kafka passthrough.

Every variant reads the same number of distinct, realistic requests (:mod:`bench.wire`)
from a topic filled beforehand, on the same embedded broker, with the same Kafka client
settings (:mod:`worker.kafka.clients`), and writes one record per request to a results topic:

* ``passthrough``: what people write today — consume up to 500 records, produce each
  value unchanged, flush, commit their offsets (at-least-once; no decoding at all); it is
  so fast that it reads the topic five times, in five consumer groups, and the five
  windows are added up;
* ``worker, defaults``: the worker as configured out of the box (``prefetch_count`` 64,
  ``max_batch_size`` 32, adaptive, exactly-once), echo engine without delay; then the
  same at-least-once, with JSON requests, and once under cProfile;
* ``worker, prefetch 1024`` and ``4096``: a deep queue in front of the batcher;
* ``worker, 64 partitions``: the requests topic in 64 partitions instead of 3 (one
  transaction per commit still, since issue 32; before, one per partition);
* ``worker, realistic prompts``: the defaults with prompts of realistic length, a system
  and a user message of about 350 characters each (:func:`realistic_requests`).

The window runs from the first answered record until a read_committed reader of the
results topic (a process of its own, left out of the CPU figures) has seen the last
result, so group joins are left out and both delivery modes are measured end to end:
exactly-once up to its last commit, at-least-once up to its last acknowledged delivery
(issue 40: the window used to end at the engine's last completion, before
exactly-once's own commits). The passthrough's window ends at its last commit.
CPU time per request is read per thread from ``/proc`` over that window: the loop thread
(the worker's single Python thread that polls, decodes, batches, encodes and produces, or
the passthrough loop), librdkafka's own threads, the worker's other threads (engine,
metrics server), and the broker process; ``process`` is the sum of the first three, and
``process_stat`` the whole process's utime + stime from ``/proc/self/stat`` (every thread,
the idle benchmark thread included; 10 ms ticks), the figure an outside observer sees.
The worker's ``batchpipe_stage_seconds_total`` counters split the loop's time by stage.
The echo engine counts UTF-8 bytes as tokens, about four per BPE token, so
``max_batch_tokens`` is raised four-fold to let batches of 32 form as they would with a
real tokenizer.

    .venv/bin/python -m bench.overhead [--requests N]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import TopicPartition
from msgspec import structs

from bench.common import fresh_config, write_result
from bench.wire import SYSTEM, brief, json_request, summary_requests
from tests.integration.harness import publish_raw
from worker.config import Config, EngineConfig, KafkaConfig
from worker.engines.base import Completion, EngineInput, OnComplete
from worker.engines.echo import EchoEngine
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.kafka.consumer import FROM_START
from worker.loop.service import Worker
from worker.obs.metrics import STAGES
from worker.wire.codec import encode_request
from worker.wire.messages import ChatMessage, InferenceRequest

N = 6_000
PASSES = 5
MAX_TOKENS = 64
_TICK = os.sysconf("SC_CLK_TCK")
Record = tuple[bytes, list[tuple[str, bytes]]]
#: characters of each message of :func:`realistic_requests`, at least
REALISTIC_CHARS = 350
_REALISTIC_SYSTEM = (
    f"{SYSTEM} Name who acted and what happened first, then where and when if the brief "
    "says so. Keep numbers, names and places exactly as written; never add ones the brief "
    "does not give. Write in the past tense, in the brief's own language, without quotes, "
    "lists or headings, and in no more than forty words. If the brief is empty or not "
    "news, answer only: nothing to summarise."
)


def realistic_requests(n: int, max_tokens: int) -> list[InferenceRequest]:
    """:func:`~bench.wire.summary_requests` with a system and a user message of at least
    :data:`REALISTIC_CHARS` characters each, as a new user's prompts are."""
    assert len(_REALISTIC_SYSTEM) >= REALISTIC_CHARS
    rng = random.Random(13)
    out = []
    for i, request in enumerate(summary_requests(n, max_tokens)):
        text = f"Summarise this brief (#{i}):\n\n{brief(rng)}"
        while len(text) < REALISTIC_CHARS:
            text += " " + brief(rng)
        messages = (ChatMessage("system", _REALISTIC_SYSTEM), ChatMessage("user", text))
        out.append(structs.replace(request, messages=messages))
    return out


def _ticks(stat_path: Path) -> float:
    """utime + stime of a process from /proc (all its threads), in seconds; 0 when gone."""
    try:
        fields = stat_path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _on_cpu(task: Path) -> float:
    """Seconds a thread has run, from its schedstat (nanoseconds, unlike stat's 10 ms ticks)."""
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except OSError:
        return 0.0


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: per thread of this process (with its name), and per child process."""

    threads: dict[int, tuple[str, float]]
    children: dict[int, float]
    #: utime + stime of this whole process, from /proc/self/stat (10 ms ticks)
    process: float = 0.0

    @classmethod
    def now(cls, exclude: frozenset[int] = frozenset()) -> CpuSample:
        threads = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            threads[int(task.name)] = (name, _on_cpu(task))
        children = {
            pid: _ticks(Path(f"/proc/{pid}/stat")) for pid in _children() if pid not in exclude
        }
        return cls(threads, children, _ticks(Path("/proc/self/stat")))

    def since(self, before: CpuSample, loop_tid: int) -> dict[str, float]:
        """CPU seconds spent since ``before``, by group."""
        groups = dict.fromkeys(("loop", "librdkafka", "other_threads", "broker"), 0.0)
        bench_tid = threading.main_thread().native_id
        for tid, (name, seconds) in self.threads.items():
            spent = seconds - before.threads.get(tid, (name, 0.0))[1]
            if tid == loop_tid:
                groups["loop"] += spent
            elif name.startswith("rdk:"):
                groups["librdkafka"] += spent
            elif tid != bench_tid:
                groups["other_threads"] += spent
        for pid, seconds in self.children.items():
            groups["broker"] += seconds - before.children.get(pid, 0.0)
        groups["process_stat"] = self.process - before.process
        return groups


@dataclass(frozen=True)
class Window:
    """What a variant did between its first and its last answered record."""

    requests: int
    seconds: float
    cpu: dict[str, float]

    def figures(self) -> dict[str, Any]:
        per = {k: round(v / self.requests * 1e6, 1) for k, v in self.cpu.items()}
        threads = ("loop", "librdkafka", "other_threads")
        per["process"] = round(sum(per[k] for k in threads), 1)
        return {
            "requests_measured": self.requests,
            "seconds": round(self.seconds, 3),
            "requests_per_s": round(self.requests / self.seconds, 1),
            "cpu_us_per_request": per,
        }


class _Watch:
    """Opens the window at the first answered record; closes it at ``total`` answered, or
    when told (:meth:`close`: the reader saw the last result) where ``closes_itself`` is
    False. CPU of the processes in ``exclude`` (the reader) is left out."""

    def __init__(
        self,
        total: int,
        loop_tid: int,
        closes_itself: bool = True,
        exclude: frozenset[int] = frozenset(),
    ) -> None:
        self.total, self.loop_tid = total, loop_tid
        self.closes_itself = closes_itself
        self.exclude = exclude
        self.closed = threading.Event()
        self.window: Window | None = None
        self._start: tuple[float, int, CpuSample] | None = None

    def observe(self, answered: int) -> None:
        if answered and self._start is None:
            self._start = (time.perf_counter(), answered, CpuSample.now(self.exclude))
        if self.closes_itself and answered >= self.total:
            self.close()

    def close(self) -> None:
        if self._start is None or self.window is not None:
            return
        t0, n0, cpu0 = self._start
        cpu = CpuSample.now(self.exclude).since(cpu0, self.loop_tid)
        self.window = Window(self.total - n0, time.perf_counter() - t0, cpu)
        self.closed.set()


class _CountingEcho(EchoEngine):
    """The echo engine, reporting how many requests it has completed to a :class:`_Watch`.

    Counting here costs the worker nothing (reading its metrics would: a snapshot walks
    the whole registry). The loop answers a completion in its next step, so the window
    ends at most one step early.
    """

    def __init__(self) -> None:
        super().__init__()
        self.watch: _Watch | None = None
        self._count = 0

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        def counted(completion: Completion) -> None:
            on_complete(completion)
            self._count += 1
            if self.watch is not None:
                self.watch.observe(self._count)

        super().run_batch(inputs, counted)


def passthrough(config: Config, total: int) -> Window:
    """Consume a batch, produce each value, flush, commit; until ``total`` are through."""
    k = config.kafka
    consumer = clients.consumer(k)
    producer = clients.producer(k)
    consumer.subscribe([k.requests_topic])
    watch = _Watch(total, threading.get_native_id())
    done = 0
    try:
        while watch.window is None:
            batch = [m for m in consumer.consume(500, timeout=0.1) if m.error() is None]
            ends: dict[tuple[str, int], int] = {}
            for m in batch:
                while True:
                    try:
                        producer.produce(k.results_topic, m.value(), m.key(), headers=m.headers())
                        break
                    except BufferError:
                        producer.poll(0.01)
                topic, partition, offset = m.topic(), m.partition(), m.offset()
                assert topic is not None and partition is not None and offset is not None
                ends[(topic, partition)] = offset + 1
            if batch:
                producer.flush(30)
                offsets = [TopicPartition(t, p, o) for (t, p), o in ends.items()]
                consumer.commit(offsets=offsets, asynchronous=False)
                done += len(batch)
            watch.observe(done)
    finally:
        consumer.close()
    return watch.window


def _read_results(bootstrap: str, topic: str, total: int, ready: Any, seen: Any) -> None:
    """In a process of its own: read ``topic`` read_committed from its start; ``seen`` is
    set once ``total`` results were read."""
    kafka = KafkaConfig(bootstrap_servers=bootstrap)
    consumer = clients.consumer(kafka, group_id=f"overhead-reader-{time.time_ns()}")
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, FROM_START) for p in partitions])
    ready.set()
    read = 0
    try:
        while read < total:
            read += sum(1 for m in consumer.consume(1000, timeout=0.05) if m.error() is None)
        seen.set()
    finally:
        consumer.close()


def through_worker(config: Config, total: int, profile: cProfile.Profile | None = None) -> Worker:
    """Run a worker on ``config`` until a read_committed reader has seen ``total`` results."""
    engine = _CountingEcho()
    worker = Worker(config, engine)
    started = threading.Event()
    k = config.kafka
    size = clients.Producers.of(k, config.limits).max_message_bytes  # as the worker makes them
    topics = [k.requests_topic, k.results_topic, k.dead_letter_topic]
    clients.ensure_topics(k, topics, max_message_bytes=size)
    spawn = multiprocessing.get_context("spawn")  # no fork of librdkafka's threads
    ready, seen = spawn.Event(), spawn.Event()
    args = (k.bootstrap_servers, k.results_topic, total, ready, seen)
    reader = spawn.Process(target=_read_results, args=args, daemon=True)
    reader.start()
    if not ready.wait(120):
        raise RuntimeError("the results reader did not start in 120 s")
    assert reader.pid is not None
    exclude = frozenset({reader.pid})

    def run() -> None:
        engine.watch = _Watch(total, threading.get_native_id(), False, exclude)
        started.set()
        if profile is not None:
            profile.runcall(worker.run)
        else:
            worker.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait()
    assert engine.watch is not None
    try:
        if not seen.wait(600):
            raise RuntimeError(f"{total} results were not read in 600 s")
        engine.watch.close()
    finally:
        worker.stop()
        thread.join(60)
        reader.join(30)
    return worker


def _stage_figures(worker: Worker, window: Window) -> dict[str, Any]:
    """The stage counters per request, and as shares of the loop thread's CPU time."""
    registry = worker.metrics.registry
    answered = worker.metrics.snapshot().requests
    seconds = {
        s: registry.get_sample_value("batchpipe_stage_seconds_total", {"stage": s}) or 0.0
        for s in STAGES
    }
    per_request = {s: round(v / answered * 1e6, 2) for s, v in seconds.items()}
    loop_us = window.cpu["loop"] / window.requests * 1e6
    share: dict[str, float] = {s: round(us / loop_us, 3) for s, us in per_request.items()}
    share["rest_of_loop"] = round(1 - sum(share.values()), 3)
    return {
        "stage_us_per_request": per_request,
        "stage_share_of_loop": share,
        "mean_batch_size": round(worker.metrics.snapshot().mean_batch_size, 1),
        "slowest_stage": max(per_request, key=lambda s: per_request[s]),
    }


def _profile_shares(profile: cProfile.Profile) -> dict[str, float]:
    """What ``Worker._step`` calls directly, each as a share of the step's time (cProfile).

    Read from the callers recorded by the profiler, so it follows the loop as it is
    written, whatever its parts are called.
    """
    stats: dict[Any, tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    step = [k for k in stats if k[2] == "_step" and k[0].endswith("worker/loop/service.py")]
    total = sum(stats[k][3] for k in step)
    shares: dict[str, float] = {}
    for (path, _, function), row in stats.items():
        from_step = sum(row[4][k][3] for k in step if k in row[4])
        if from_step:
            name = f"{Path(path).stem}.{function}" if path.startswith("/") else function
            shares[name] = shares.get(name, 0.0) + from_step / total
    return {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v >= 0.001}


@dataclass(frozen=True)
class Variant:
    """One way through the broker: the records it reads and the worker settings it runs."""

    name: str
    records: Sequence[Record]
    prefetch_count: int = 64
    delivery: Literal["exactly_once", "at_least_once"] = "exactly_once"
    #: of the requests topic
    partitions: int = 3

    def config(self, bootstrap: str) -> Config:
        config = fresh_config(
            bootstrap, max_batch_tokens=4 * 8192, prefetch_count=self.prefetch_count
        )
        kafka = replace(config.kafka, delivery=self.delivery, partitions=self.partitions)
        return replace(config, engine=EngineConfig(kind="echo"), kafka=kafka)


def _measure(bootstrap: str, variant: Variant, run: Callable[[Config], dict[str, Any]]) -> Any:
    config = variant.config(bootstrap)
    publish_raw(config, variant.records)
    row = {
        "name": variant.name,
        "prefetch_count": variant.prefetch_count,
        "delivery": variant.delivery,
        **run(config),
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=N)
    total = parser.parse_args(argv).requests
    requests = summary_requests(total, MAX_TOKENS)
    protobuf = [encode_request(r) for r in requests]
    as_json = [json_request(r) for r in requests]
    realistic = [encode_request(r) for r in realistic_requests(total, MAX_TOKENS)]

    def worker_run(config: Config) -> dict[str, Any]:
        worker = through_worker(config, total)
        window = worker.engine.watch.window  # type: ignore[attr-defined]
        return {**window.figures(), **_stage_figures(worker, window)}

    def profiled_run(config: Config) -> dict[str, Any]:
        profile = cProfile.Profile()
        through_worker(config, total, profile)
        return {"share_of_loop_time": _profile_shares(profile)}

    def passthrough_run(config: Config) -> dict[str, Any]:
        # it moves the records in ~50 ms, too short to time once: PASSES groups each read
        # the whole topic, and the windows add up
        windows = []
        for i in range(PASSES):
            group = f"{config.kafka.group_id}-{i}"
            window = passthrough(
                replace(config, kafka=replace(config.kafka, group_id=group)), total
            )
            assert window is not None
            windows.append(window)
        cpu = {k: sum(w.cpu[k] for w in windows) for k in windows[0].cpu}
        summed = Window(sum(w.requests for w in windows), sum(w.seconds for w in windows), cpu)
        passes = [round(w.requests / w.seconds) for w in windows]
        return {**summed.figures(), "passes": PASSES, "requests_per_s_by_pass": passes}

    with EmbeddedBroker() as broker:
        b = broker.bootstrap
        default = Variant("worker, defaults", protobuf)
        rows = [
            _measure(
                b, Variant("passthrough", protobuf, delivery="at_least_once"), passthrough_run
            ),
            _measure(b, default, worker_run),
            _measure(
                b,
                replace(default, name="worker, at_least_once", delivery="at_least_once"),
                worker_run,
            ),
            _measure(
                b, replace(default, name="worker, JSON requests", records=as_json), worker_run
            ),
            _measure(b, replace(default, name="worker, cProfile"), profiled_run),
            _measure(
                b, replace(default, name="worker, prefetch 1024", prefetch_count=1024), worker_run
            ),
            _measure(
                b, replace(default, name="worker, prefetch 4096", prefetch_count=4096), worker_run
            ),
            _measure(b, replace(default, name="worker, 64 partitions", partitions=64), worker_run),
            _measure(
                b,
                replace(default, name="worker, realistic prompts", records=realistic),
                worker_run,
            ),
        ]
    raw, worker = rows[0], rows[1]
    cpu = worker["cpu_us_per_request"]
    real = rows[-1]["cpu_us_per_request"]
    figures = {
        "requests": total,
        "request_value_bytes": round(sum(len(v) for v, _ in protobuf) / total, 1),
        "realistic_request_value_bytes": round(sum(len(v) for v, _ in realistic) / total, 1),
        "max_tokens": MAX_TOKENS,
        "engine": "echo, no simulated delay",
        "batching": "defaults (prefetch 64, max_batch_size 32, timeout 100 ms, adaptive) "
        "but max_batch_tokens 32768 (echo counts bytes as tokens)",
        "variants": rows,
        "partitions": default.partitions,
        "ratio_vs_passthrough": {
            r["name"]: round(r["requests_per_s"] / raw["requests_per_s"], 4)
            for r in rows[1:]
            if "requests_per_s" in r
        },
        "one_core_requests_per_s": {
            "worker_process": round(1e6 / cpu["process"]),
            "worker_process_stat": round(1e6 / cpu["process_stat"]),
            "worker_loop_thread": round(1e6 / cpu["loop"]),
            "realistic_worker_process_stat": round(1e6 / real["process_stat"]),
            "realistic_worker_loop_thread": round(1e6 / real["loop"]),
        },
        "slowest_stage": worker["slowest_stage"],
    }
    path = write_result("overhead", figures)
    print(path, json.dumps({k: v for k, v in figures.items() if k != "variants"}))
    return figures


if __name__ == "__main__":
    main()
