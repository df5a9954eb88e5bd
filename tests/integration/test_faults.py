"""Faults: two workers losing one, drain, fuzzed input (the chaos suite has the rest).

Tansu (the embedded broker) delivers records of aborted transactions to read_committed
readers, so raw duplicates on the results topic are expected after a kill; what must
hold is no loss, and one line per custom_id in what ``collect`` writes.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from tests.integration.harness import (
    ResultWatcher,
    publish,
    publish_raw,
    start_worker_process,
    write_config,
)
from worker.config import Config
from worker.wire.codec import encode_request
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

pytestmark = pytest.mark.integration


def slow_echo(config: Config, **batching: object) -> Config:
    """The echo engine acting like a model: 2 ms a generated token."""
    return replace(
        config,
        engine=replace(config.engine, kind="echo", model="echo", simulated_token_s=0.002),
        batching=replace(config.batching, **batching),  # type: ignore[arg-type]
        metrics=replace(config.metrics, host="127.0.0.1", port=0),
        worker=replace(config.worker, drain_timeout_s=20.0),
    )


def batch(n: int, batch_id: str = "faults") -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            batch_id=batch_id,
            batch_total=n,
            messages=(ChatMessage("user", f"request number {i}"),),
            sampling=SamplingParams(max_tokens=8, temperature=0.0),
            submitted_at=time.time(),
        )
        for i in range(n)
    ]


def test_two_workers_one_killed_for_good(kafka_config: Config, tmp_path: Path) -> None:
    config = slow_echo(kafka_config)
    n = 1500
    publish(config, batch(n))
    path = write_config(config, tmp_path / "worker.yaml")
    watcher = ResultWatcher(config)
    first, second = start_worker_process(path), start_worker_process(path)
    try:
        watcher.wait_for(n // 4, timeout_s=120)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        watcher.wait_for(n, timeout_s=180)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
        watcher.close()
    assert len(watcher.ids) == n


def test_sigterm_drains_exits_zero_and_loses_nothing(kafka_config: Config, tmp_path: Path) -> None:
    config = slow_echo(kafka_config)
    n = 1500
    publish(config, batch(n))
    path = write_config(config, tmp_path / "worker.yaml")
    watcher = ResultWatcher(config)
    worker = start_worker_process(path)
    try:
        watcher.wait_for(n // 3, timeout_s=120)
        stopped = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(config.worker.drain_timeout_s + 10) == 0
        assert time.monotonic() - stopped < config.worker.drain_timeout_s + 10
        worker = start_worker_process(path)
        watcher.wait_for(n, timeout_s=180)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        watcher.close()
    assert len(watcher.ids) == n


def fuzzed(rng: random.Random, valid: bytes) -> tuple[bytes, list[tuple[str, bytes]] | None]:
    """Random bytes, mutated frames, wrong headers, huge declared sizes."""
    proto = [
        ("content-type", b"application/x-protobuf; type=batchpipe.v1.InferenceRequest"),
        ("content-encoding", b"zstd"),
    ]
    kind = rng.randrange(5)
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300)), None
    if kind == 1:
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data), proto
    if kind == 2:
        return valid, [("content-type", b"text/plain"), ("content-encoding", b"br")]
    if kind == 3:
        size = rng.randint(7, 64) * 1024 * 1024
        return zstandard.ZstdCompressor().compress(b"\0" * size)[:64], proto
    return valid[: rng.randrange(len(valid))], proto


def test_fuzzed_payloads_never_stop_the_worker(kafka_config: Config, tmp_path: Path) -> None:
    config = slow_echo(kafka_config)
    rng = random.Random(11)
    good = [encode_request(r) for r in batch(500, batch_id="fuzz")]
    template = good[0][0]
    fuzz = [fuzzed(rng, template) for _ in range(1000)]
    records = good + fuzz
    rng.shuffle(records)
    publish_raw(config, records)
    path = write_config(config, tmp_path / "worker.yaml")
    worker = start_worker_process(path)
    watcher = ResultWatcher(config)
    try:
        # every record answered: a result (valid, or an error with a recovered custom_id)
        # or a dead letter; no transaction is aborted in this run, so no duplicates
        watcher.wait_until(
            lambda: watcher.raw + watcher.dead >= len(records),
            timeout_s=180,
            what=f"{len(records)} records answered",
        )
        late = watcher.poll(3.0)
        assert worker.poll() is None, "the worker died"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        watcher.close()
    assert late == 0, f"{late} answers beyond one per record"
    assert watcher.raw + watcher.dead == len(records), (watcher.raw, watcher.dead)
    assert {f"r{i}" for i in range(500)} <= watcher.ids
    assert watcher.dead > 0
