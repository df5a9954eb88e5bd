"""A worker with ``engine.kind: openai`` on the embedded broker, in front of the stand-in
server (bench/openai_standin.py): batches submitted and collected as a user does, every
answer read with the official SDK's types, through a 429 storm and a server that dies."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchpipe import Client
from bench.openai_standin import StandIn
from tests.integration.harness import running_worker
from tests.openai_sdk import ChatCompletion, Completion, Response, sdk_line
from worker.config import Config, RemoteConfig
from worker.engines.remote.engine import RemoteEngine
from worker.kafka.cancellations import Stop, announce

pytestmark = pytest.mark.integration

MODEL = "served-model"
WAIT_S = 300.0  # a bound on a batch of this size, not a pace


@pytest.fixture
def server() -> Iterator[StandIn]:
    standin = StandIn(model=MODEL, token_s=0.005, max_running=16).start()
    yield standin
    standin.stop()


def remote_config(config: Config, server: StandIn, **remote: Any) -> Config:
    settings = replace(
        RemoteConfig(),
        base_url=server.base_url,
        allow_private=True,  # the stand-in listens on 127.0.0.1
        backoff_s=0.05,
        backoff_max_s=0.5,
        **remote,
    )
    engine = replace(config.engine, kind="openai", model=MODEL, remote=settings)
    return replace(config, engine=engine)


def line(i: int) -> dict[str, Any]:
    """Chat, completions and responses lines in turn, each naming the served model."""
    words = " ".join(f"w{i}-{j}" for j in range(3 + i % 5))
    if i % 3 == 0:
        url, body = "/v1/completions", {"prompt": words, "max_tokens": 4}
    elif i % 3 == 1:
        url, body = "/v1/responses", {"input": words, "max_output_tokens": 4}
    else:
        url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": words}]}
        body["max_tokens"] = 4
    return {"custom_id": f"r{i}", "method": "POST", "url": url, "body": {"model": MODEL, **body}}


Lines = list[dict[str, Any]]


def run_batch(config: Config, n: int, tmp_path: Path, during: Any = None) -> tuple[Lines, Lines]:
    """Submit ``n`` lines, run one worker until collect has every answer; the output and
    error lines. ``during(server_requests_seen)`` is called while it runs."""
    client = Client(config)
    receipt = client.submit([line(i) for i in range(n)])
    output, errors = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    with running_worker(config):
        if during is not None:
            during()
        client.collect(receipt.batch_id, output, errors, timeout_s=WAIT_S)
    out = [json.loads(x) for x in output.read_text().splitlines()]
    err = [json.loads(x) for x in errors.read_text().splitlines()]
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n)), "every request answered once"
    return out, err


def test_a_batch_through_a_429_storm_completes_with_every_answer_read_by_the_sdk(
    kafka_config: Config, server: StandIn, tmp_path: Path
) -> None:
    config = remote_config(kafka_config, server, max_retries=30, initial_concurrency=8)

    def storm() -> None:
        deadline = time.monotonic() + WAIT_S
        while server.requests < 20:  # the batch is running
            assert time.monotonic() < deadline, "the worker never reached the server"
            time.sleep(0.02)
        server.fail(429, seconds=1.5)

    out, err = run_batch(config, 90, tmp_path, storm)
    assert err == []
    parsed = [sdk_line(x) for x in out]
    kinds = {type(p) for p in parsed}
    assert kinds == {ChatCompletion, Completion, Response}
    assert all(getattr(p, "usage", None) is not None for p in parsed)
    by_id = {x["custom_id"]: x["response"]["body"] for x in out}
    assert by_id["r2"]["choices"][0]["message"]["content"] == "w2-0 w2-1 w2-2 w2-3"
    assert by_id["r0"]["usage"]["prompt_tokens"] == len("w0-0 w0-1 w0-2") // 4 + 1


def test_a_server_that_dies_mid_batch_leaves_every_request_answered_once(
    kafka_config: Config, server: StandIn, tmp_path: Path
) -> None:
    config = remote_config(kafka_config, server, max_retries=2)
    server.token_s = 0.05  # slow enough that the death lands mid-batch

    def die() -> None:
        deadline = time.monotonic() + WAIT_S
        while server.requests < 10:
            assert time.monotonic() < deadline, "the worker never reached the server"
            time.sleep(0.02)
        server.stop()

    out, err = run_batch(config, 60, tmp_path, die)
    assert err and len(out) < 60, "requests sent after the death failed"
    for x in err:
        error = x["error"]
        assert error["code"] == "5000" and "connection" in error["message"], error
        sdk_line(x)


def test_cancelling_a_batch_closes_its_calls_to_the_server(
    kafka_config: Config, server: StandIn
) -> None:
    config = remote_config(kafka_config, server, initial_concurrency=4)
    server.hang = True  # every call stays open until the worker closes it
    client = Client(config)
    receipt = client.submit([line(i) for i in range(8)])
    with running_worker(config) as worker:
        engine = worker.engine
        assert isinstance(engine, RemoteEngine)
        deadline = time.monotonic() + WAIT_S
        while server.requests < 4:  # the window's four calls are open on the server
            assert time.monotonic() < deadline, "the worker never reached the server"
            time.sleep(0.02)
        announce(config.kafka, Stop(receipt.batch_id, "cancelled", time.time()))
        results = list(client.results(receipt.batch_id, timeout_s=WAIT_S))
        assert sorted(r.custom_id for r in results) == sorted(f"r{i}" for i in range(8))
        assert {r.error.code for r in results if r.error} == {4005}
        assert engine.capacity().sequences == 4, "the aborted calls gave their room back"
        assert engine._snapshot().in_flight == 0
    assert server.requests == 4, "no call was sent for a cancelled request"


def tier_lines(who: str, n: int) -> Lines:
    """Chat lines whose prompt starts with ``who``: the stand-in counts them by it."""
    body = {"model": MODEL, "max_tokens": 8}
    return [
        {
            "custom_id": f"{who}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**body, "messages": [{"role": "user", "content": f"{who} {i} " + "w " * 8}]},
        }
        for i in range(n)
    ]


class Interactive:
    """The server's own users: ``clients`` threads sending chat requests back to back
    straight to it (never through batchpipe) until stopped."""

    def __init__(self, server: StandIn, clients: int) -> None:
        self._url = f"{server.base_url}/chat/completions"
        self._stop = threading.Event()
        self.answered = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._user, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _user(self) -> None:
        content = "interactive " + "w " * 8
        body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
        with httpx.Client(timeout=WAIT_S) as http:
            while not self._stop.is_set():
                assert http.post(self._url, json=body).status_code == 200
                with self._lock:
                    self.answered += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT_S)


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)


def test_a_flex_batch_gives_way_to_the_servers_interactive_traffic_and_a_default_one_does_not(
    kafka_config: Config, server: StandIn
) -> None:
    """Issue 50: with the remote engine, flex yields to the server's interactive traffic
    first. A flex batch runs alone; the server's own users start a steady load that keeps
    its queue non-empty (8 clients, 4 running slots). The worker stops starting flex
    requests — none reaches the server while the load lasts — yet a default-tier batch
    submitted during the same load is sent and finishes (the queue gate lets the other
    tiers send up to ``max_waiting``). When the load ends, the flex batch finishes:
    every line of both answered once."""
    server.max_running, server.token_s = 4, 0.01
    config = remote_config(
        kafka_config,
        server,
        metrics_url=f"http://127.0.0.1:{server.port}/metrics",
        metrics_interval_ms=100,
        max_waiting=64,  # the other tiers send through a queue this deep
        flex_quiet_ms=1000,
        initial_concurrency=8,
    )
    config = replace(config, scheduling=replace(config.scheduling, fair=True))
    client = Client(config)
    flex = client.submit(tier_lines("flex", 300), tier="flex")
    with running_worker(config) as worker:
        engine = worker.engine
        assert isinstance(engine, RemoteEngine)
        until(lambda: server.arrivals["flex"] >= 10, "the flex batch to reach the server")
        load = Interactive(server, clients=8)
        try:
            until(lambda: not engine._snapshot().flex_open, "flex to give way")
            until(lambda: engine._snapshot().in_flight == 0, "the flex calls sent to end")
            flex_sent, answered = server.arrivals["flex"], load.answered
            assert flex_sent < 300, "the load began before the flex batch was all sent"
            default = client.submit(tier_lines("default", 20))
            until(lambda: server.arrivals["default"] == 20, "the default batch sent")
            results = list(client.results(default.batch_id, timeout_s=WAIT_S))
            assert sorted(r.custom_id for r in results) == sorted(f"default{i}" for i in range(20))
            assert all(r.error is None for r in results)
            until(lambda: load.answered >= answered + 40, "40 more interactive answers")
            assert server.arrivals["flex"] == flex_sent, "a flex request went in the load"
            assert not engine._snapshot().flex_open
        finally:
            load.stop()
        results = list(client.results(flex.batch_id, timeout_s=WAIT_S))
        assert sorted(r.custom_id for r in results) == sorted(f"flex{i}" for i in range(300))
        assert all(r.error is None for r in results)
        assert server.arrivals["flex"] == 300, "each flex request sent once"
