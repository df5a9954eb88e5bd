"""The remote engine against the in-process stand-in server (bench/openai_standin.py):
every request answered once, whatever the server does — 429/503 storms, a hang, a death."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from cryptography import x509
from msgspec import structs

from batcher import Pending
from bench.openai_standin import StandIn
from tests.certs import self_signed
from tests.unit.conftest import resolved
from worker.config import BatchingConfig, EngineConfig, GenerationConfig, RemoteConfig
from worker.engines.base import Completion, EngineInput
from worker.engines.factory import create_engine
from worker.engines.remote.bodies import request_call
from worker.engines.remote.engine import RemoteEngine
from worker.errors import ModelLoadError
from worker.loop.intake import Intake
from worker.loop.jobs import Identity, Job, Source
from worker.wire.codec import CodecLimits, encode_request
from worker.wire.messages import ChatMessage, InferenceRequest

WAIT_S = 60.0  # a bound on what the tests submit, not a pace


@pytest.fixture
def server() -> Iterator[StandIn]:
    standin = StandIn(model="m", token_s=0.002, max_running=8).start()
    yield standin
    standin.stop()


class Served(Protocol):
    """A server to point an engine at (the stand-in, or test_hostile's)."""

    @property
    def base_url(self) -> str: ...


def make(server: Served, **remote: Any) -> RemoteEngine:
    settings = {
        "base_url": server.base_url,
        "allow_private": True,
        "backoff_s": 0.01,
        "backoff_max_s": 0.05,
        **remote,
    }
    config = EngineConfig(kind="openai", model="m", remote=replace(RemoteConfig(), **settings))
    engine = create_engine(config, BatchingConfig())
    assert isinstance(engine, RemoteEngine)
    engine.load()
    return engine


@pytest.fixture
def engine(server: StandIn) -> Iterator[RemoteEngine]:
    loaded = make(server)
    yield loaded
    loaded.close()


def item(
    engine: RemoteEngine, key: str, text: str = "one two three four", **s: object
) -> EngineInput:
    request = InferenceRequest(key, messages=(ChatMessage("user", text),))
    return EngineInput(key, engine.encode(request), resolved(**{"max_tokens": 16, **s}))


def collect(engine: RemoteEngine, keys: set[str]) -> dict[str, Completion]:
    seen: dict[str, Completion] = {}
    deadline = time.monotonic() + WAIT_S
    while not keys <= seen.keys():
        assert time.monotonic() < deadline, f"no completion for {keys - seen.keys()}"
        for c in engine.completions(timeout_s=0.05):
            assert c.key not in seen, f"{c.key} completed twice"
            seen[c.key] = c
    return seen


def test_each_request_is_answered_once_with_the_servers_usage(engine: RemoteEngine) -> None:
    inputs = [item(engine, f"k{i}", "alpha beta gamma " * (i + 1), max_tokens=4) for i in range(6)]
    for i in inputs:
        engine.submit(i)
    done = collect(engine, {i.key for i in inputs})
    assert done["k0"].text == "alpha beta gamma" and done["k0"].finish_reason == "stop"
    assert done["k5"].completion_tokens == 4 and done["k5"].finish_reason == "length"
    assert done["k0"].prompt_tokens == len("alpha beta gamma ") // 4 + 1  # the server's count
    assert engine.completions(timeout_s=0.1) == []


def test_n_choices_come_back_as_n_choices(engine: RemoteEngine) -> None:
    engine.submit(item(engine, "k", "alpha beta", n=3))
    done = collect(engine, {"k"})["k"]
    assert done.error is None and done.text == "alpha beta"
    assert [c.text for c in done.extra_choices] == ["alpha beta", "alpha beta"]


def test_enable_thinking_is_sent_when_the_request_or_the_configuration_sets_it(
    engine: RemoteEngine,
) -> None:
    def sent(thinking: bool | None, generation: GenerationConfig) -> object:
        request = InferenceRequest("c", messages=(ChatMessage("user", "hi"),))
        intake = Intake(
            engine, Identity("w", "m"), BatchingConfig(), generation, CodecLimits(4096, 4096)
        )
        admitted = intake.take(
            Source("t", 0, 0),
            *encode_request(structs.replace(request, enable_thinking=thinking)),
            0.0,
        )
        assert isinstance(admitted, Pending), admitted
        job: Job = admitted.payload
        return request_call("m", job.engine_input).body.get("chat_template_kwargs")

    default, configured = GenerationConfig(), GenerationConfig(enable_thinking=True)
    assert sent(None, default) is None, "unset and off by default: OpenAI's fields only"
    assert sent(None, configured) == {"enable_thinking": True}
    assert sent(False, configured) == {"enable_thinking": False}
    assert sent(False, default) == {"enable_thinking": False}


def test_an_aborted_request_is_closed_and_never_completed(
    engine: RemoteEngine, server: StandIn
) -> None:
    server.hang = True
    doomed = item(engine, "doomed")
    engine.submit(doomed)
    before = engine.capacity()
    engine.abort(["doomed"])
    assert engine.capacity().sequences == before.sequences + 1
    server.hang = False
    kept = item(engine, "kept")
    engine.submit(kept)
    assert set(collect(engine, {"kept"})) == {"kept"}
    assert engine.completions(timeout_s=0.2) == []


def test_a_429_and_503_storm_is_retried_and_the_window_backs_off(server: StandIn) -> None:
    engine = make(server, initial_concurrency=8, max_retries=8)
    try:
        server.fail(429, count=6)
        inputs = [item(engine, f"k{i}") for i in range(8)]
        for i in inputs:
            engine.submit(i)
        done = collect(engine, {i.key for i in inputs})
        assert all(c.error is None for c in done.values())
        assert engine.capacity().sequences < 8, "the window was cut"
        stats = engine._snapshot()
        assert stats.responses["http_429"] == 6 and stats.retries == 6 and stats.cuts >= 1
    finally:
        engine.close()


def test_retries_give_up_with_5000_naming_the_status(server: StandIn) -> None:
    engine = make(server, max_retries=2)
    try:
        server.fail(503, seconds=60)
        engine.submit(item(engine, "k"))
        c = collect(engine, {"k"})["k"]
        assert c.error is not None and c.error.code == 5000
        assert "3 attempts" in c.error.message and "HTTP 503" in c.error.message
        assert server.requests == 3
    finally:
        engine.close()


def test_a_4xx_is_4002_with_the_servers_message(engine: RemoteEngine, server: StandIn) -> None:
    server.fail(400, count=1)
    engine.submit(item(engine, "k"))
    c = collect(engine, {"k"})["k"]
    assert c.error is not None and c.error.code == 4002
    assert "HTTP 400" in c.error.message and "stand-in answers 400" in c.error.message
    assert server.requests == 1, "a 4xx is not retried"


def test_a_hanging_server_times_out_and_every_request_is_answered(server: StandIn) -> None:
    engine = make(server, timeout_s=0.3, max_retries=1)
    try:
        server.hang = True
        for i in range(3):
            engine.submit(item(engine, f"k{i}"))
        done = collect(engine, {"k0", "k1", "k2"})
        assert {c.error.code for c in done.values() if c.error} == {5000}
        assert all(
            "no answer within 0.3 s" in (c.error.message if c.error else "") for c in done.values()
        )
    finally:
        engine.close()


def test_a_server_that_dies_mid_batch_leaves_no_request_unanswered(server: StandIn) -> None:
    engine = make(server, max_retries=2)
    try:
        slow = [item(engine, f"k{i}", "w " * 200, max_tokens=200) for i in range(4)]
        for i in slow:
            engine.submit(i)
        deadline = time.monotonic() + WAIT_S
        while server.running < 4:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.stop()
        done = collect(engine, {i.key for i in slow})
        assert all(c.error is not None and c.error.code == 5000 for c in done.values())
        assert all("connection" in c.error.message for c in done.values() if c.error)
    finally:
        engine.close()


def test_the_servers_queue_closes_the_gate(server: StandIn) -> None:
    engine = make(
        server,
        metrics_url=f"http://127.0.0.1:{server.port}/metrics",
        metrics_interval_ms=50,
        max_concurrency=32,
        initial_concurrency=32,
        max_waiting=0,
    )
    try:
        server.max_running = 1
        for i in range(3):  # one runs, two wait on the server
            engine.submit(item(engine, f"k{i}", "w " * 100, max_tokens=100))
        deadline = time.monotonic() + WAIT_S
        while engine.capacity().sequences != 0:
            assert time.monotonic() < deadline, "the gate never closed"
            time.sleep(0.02)
        assert engine._snapshot().server_waiting >= 1
        collect(engine, {"k0", "k1", "k2"})
        while engine.capacity().sequences == 0:
            assert time.monotonic() < deadline, "the gate never opened again"
            time.sleep(0.02)
    finally:
        engine.close()


def test_load_refuses_private_targets_unknown_models_and_sends_the_key(
    server: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(
        kind="openai", model="m", remote=replace(RemoteConfig(), base_url=server.base_url)
    )
    with pytest.raises(ModelLoadError, match=r"127\.0\.0\.1, a loopback address"):
        create_engine(config, BatchingConfig()).load()
    with pytest.raises(ModelLoadError, match="'other' is not served"):
        create_engine(
            replace(config, model="other", remote=replace(config.remote, allow_private=True)),
            BatchingConfig(),
        ).load()
    monkeypatch.setenv("SECRET_FOR_TEST", "sk-test")
    engine = make(server, api_key_env="SECRET_FOR_TEST")
    try:
        engine.submit(item(engine, "k"))
        collect(engine, {"k"})
    finally:
        engine.close()
    assert server.authorization == "Bearer sk-test"


def test_embeddings_go_to_the_embeddings_endpoint_with_their_dimensions(server: StandIn) -> None:
    settings = replace(RemoteConfig(), base_url=server.base_url, allow_private=True)
    config = EngineConfig(kind="openai", model="m", task="embed", remote=settings)
    engine = create_engine(config, BatchingConfig())
    engine.load()
    try:
        assert isinstance(engine, RemoteEngine) and engine.endpoints == {"embeddings"}
        request = InferenceRequest("k", embedding_inputs=("a cat", "a dog"), dimensions=4)
        inputs = engine.encode_inputs(request)
        flat = tuple(i for ids in inputs for i in ids)
        engine.submit(EngineInput("k", flat, resolved(max_tokens=0), inputs))
        c = collect(engine, {"k"})["k"]
        assert c.error is None and len(c.embeddings) == 2
        assert all(len(v) == 4 for v in c.embeddings) and c.embeddings[0] != c.embeddings[1]
        assert c.prompt_tokens == (len("a cat") // 4 + 1) + (len("a dog") // 4 + 1)
    finally:
        engine.close()


def test_tls_is_verified_and_a_ca_bundle_trusts_a_private_ca(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, x509.IPAddress(ipaddress.ip_address("127.0.0.1")), "ca")
    server = StandIn(model="m", certfile=str(cert), keyfile=str(key)).start()
    try:
        assert server.base_url.startswith("https://")
        with pytest.raises(ModelLoadError, match="CERTIFICATE_VERIFY_FAILED"):
            make(server)
        with pytest.raises(ModelLoadError, match=r"engine\.remote\.ca_bundle: cannot use"):
            make(server, ca_bundle=str(tmp_path / "missing.pem"))
        engine = make(server, ca_bundle=str(cert))
        try:
            engine.submit(item(engine, "k"))
            assert collect(engine, {"k"})["k"].error is None
        finally:
            engine.close()
    finally:
        server.stop()


def test_flex_gives_way_to_the_servers_own_queue_before_the_other_tiers(
    server: StandIn,
) -> None:
    """Interactive requests queue on the server (sent straight to it, as its own users
    do): flex closes at the first reading of a queue, while the other tiers keep sending
    up to max_waiting; it opens again only after flex_quiet_ms without pressure."""
    engine = make(
        server,
        metrics_url=f"http://127.0.0.1:{server.port}/metrics",
        metrics_interval_ms=50,
        max_waiting=8,
        flex_quiet_ms=300,
    )
    try:
        assert engine.capacity().flex  # nothing seen yet
        server.max_running = 1
        chat = [{"role": "user", "content": "w " * 50}]
        body: dict[str, Any] = {"model": "m", "messages": chat, "max_tokens": 50}
        with concurrent.futures.ThreadPoolExecutor(3) as interactive:
            sent = [
                interactive.submit(httpx.post, f"{server.base_url}/chat/completions", json=body)
                for _ in range(3)  # one runs, two wait
            ]
            until(lambda: not engine.capacity().flex, "flex to give way to the server's queue")
            room = engine.capacity()
            assert room.sequences > 0, "the other tiers still send: the queue is within 8"
            snapshot = engine._snapshot()
            assert snapshot.server_waiting >= 1 and snapshot.flex_closings == 1
            assert all(answer.result(WAIT_S).status_code == 200 for answer in sent)
        until(lambda: engine.capacity().flex, "flex to open after the quiet period")
        assert engine._snapshot().server_waiting == 0
    finally:
        engine.close()


def test_an_overload_answer_closes_flex_for_the_quiet_period(server: StandIn) -> None:
    engine = make(server, flex_quiet_ms=60_000)
    try:
        server.fail(429, count=1)
        engine.submit(item(engine, "k"))
        assert collect(engine, {"k"})["k"].error is None  # retried, then answered
        assert not engine.capacity().flex and engine._snapshot().flex_closings == 1
    finally:
        engine.close()


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.02)
