"""The worker on a real broker with the echo engine: every record gets exactly one answer."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import zstandard
from msgspec import structs

from tests.integration.harness import (
    Record,
    publish,
    publish_raw,
    read_results,
    read_topic,
    running_worker,
)
from worker.config import Config
from worker.engines.echo import EchoEngine
from worker.wire.codec import JSON_CONTENT_TYPE, REQUEST_CONTENT_TYPE, encode_request
from worker.wire.messages import ChatMessage, InferenceRequest, InferenceResult, SamplingParams

pytestmark = pytest.mark.integration


def echo_config(config: Config, **batching: object) -> Config:
    return replace(
        config,
        engine=replace(config.engine, kind="echo", model="echo"),
        batching=replace(config.batching, **batching),  # type: ignore[arg-type]
    )


def chat(i: int, **fields: object) -> InferenceRequest:
    return InferenceRequest(
        custom_id=f"req-{i}",
        batch_id="b1",
        batch_total=0,
        messages=(ChatMessage("user", f"hello {i}"),),
        sampling=SamplingParams(max_tokens=32, temperature=0.0),
        metadata={"row": str(i)},
        submitted_at=time.time(),
        **fields,  # type: ignore[arg-type]
    )


def answered_once(config: Config, n: int) -> list[InferenceResult]:
    """Run a worker until ``chat(0..n-1)`` are answered; check each answer came once, right."""
    publish(config, (chat(i) for i in range(n)))
    with running_worker(config):
        results = read_results(config, n)
    by_id = {r.custom_id: r for r in results}
    assert len(results) == n and len(by_id) == n
    for i in range(n):
        r = by_id[f"req-{i}"]
        assert r.status == "completed", r.error
        assert r.text == f"hello {i}"
        assert dict(r.metadata) == {"row": str(i)}
        assert r.usage.completion_tokens == len(f"hello {i}")
        assert r.batch_size >= 1 and r.model == "echo"
    return results


def test_every_request_answered_once_with_its_metadata(kafka_config: Config) -> None:
    answered_once(echo_config(kafka_config), 300)


def test_an_in_flight_engine_answers_every_request_once(kafka_config: Config) -> None:
    config = echo_config(kafka_config)
    engine = replace(
        config.engine,
        echo_mode="in_flight",
        simulated_token_s=0.0005,  # paced, so requests share decoding steps
        simulated_token_per_seq_s=0.00001,
    )
    results = answered_once(replace(config, engine=engine), 300)
    assert max(r.batch_size for r in results) > 1  # requests joined others in flight


def test_at_least_once_delivery_answers_everything(kafka_config: Config) -> None:
    config = echo_config(kafka_config)
    config = replace(config, kafka=replace(config.kafka, delivery="at_least_once"))
    publish(config, (chat(i) for i in range(100)))
    with running_worker(config):
        results = read_results(config, 100)
    assert sorted(r.custom_id for r in results) == sorted(f"req-{i}" for i in range(100))


def _pb_payload(request: InferenceRequest) -> bytes:
    value, _ = encode_request(request)
    return zstandard.ZstdDecompressor().decompress(value)


def test_bad_records_are_answered_and_do_not_stop_the_worker(kafka_config: Config) -> None:
    config = echo_config(kafka_config)
    proto = [("content-type", REQUEST_CONTENT_TYPE.encode()), ("content-encoding", b"zstd")]
    as_json = [("content-type", JSON_CONTENT_TYPE.encode())]
    zstd = zstandard.ZstdCompressor()
    bomb = zstd.compress(b"\0" * (64 * 1024 * 1024))  # a few KB declaring 64 MiB
    line = {"custom_id": "json-bad-url", "method": "POST", "url": "/v1/images", "body": {}}
    records: list[Record] = [
        encode_request(chat(1)),
        (b"\x28\xb5\x2f\xfd" + b"garbage" * 10, proto),  # undecodable zstd
        (zstd.compress(_pb_payload(chat(99))[:-5]), proto),  # truncated protobuf
        (b'{"hello": "world"}', as_json),  # JSON that is not a batch line
        (json.dumps({"method": "POST", "url": "/v1/chat/completions"}).encode(), as_json),
        (bomb, proto),
        (json.dumps(line).encode(), as_json),  # custom_id recoverable: 4002 result
        encode_request(chat(2)),
    ]
    publish_raw(config, records)
    with running_worker(config):
        results = read_results(config, 3)
        letters = read_topic(config, config.kafka.dead_letter_topic, 5)
    by_id = {r.custom_id: r for r in results}
    assert by_id["req-1"].status == by_id["req-2"].status == "completed"
    assert by_id["json-bad-url"].error is not None and by_id["json-bad-url"].error.code == 4002
    codes = sorted(int(dict(m.headers() or [])["error-code"] or b"0") for m in letters)
    assert codes == [4001, 4001, 4001, 4001, 4003]
    originals = {m.value() for m in letters}
    assert bomb in originals and b'{"hello": "world"}' in originals


def test_limits_deadline_and_model_are_answered_with_their_codes(kafka_config: Config) -> None:
    config = echo_config(kafka_config, max_batch_tokens=256)
    requests = [
        chat(1, deadline=time.time() - 5),
        chat(2, model="some-other-model"),
        structs.replace(chat(3), messages=(ChatMessage("user", "x" * 300),)),
        chat(4),
    ]
    publish(config, requests)
    with running_worker(config):
        results = read_results(config, 4)
    codes = {r.custom_id: (r.error.code if r.error else 0) for r in results}
    assert codes == {"req-1": 4004, "req-2": 4002, "req-3": 4003, "req-4": 0}


def test_raw_producers_get_every_field_honoured_or_refused(kafka_config: Config) -> None:
    """Nothing silently ignored from a raw Kafka producer, JSON or protobuf (issue 17)."""
    config = echo_config(kafka_config)
    as_json = [("content-type", JSON_CONTENT_TYPE.encode())]

    def line(custom_id: str, **body: object) -> Record:
        messages = [{"role": "user", "content": "hi"}]
        row = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
        return json.dumps({**row, "body": {"messages": messages, **body}}).encode(), as_json

    value, headers = encode_request(chat(5))
    unknown = zstandard.ZstdCompressor().compress(_pb_payload(chat(6)) + b"\xa0\x06\x01")
    records: list[Record] = [
        line("stream", stream=True),
        line("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        line("future", some_future_field=1),
        line("format", response_format={"type": "json_object"}),  # echo: its minimal instance
        line(
            "bad-schema",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": 5}},
            },
        ),
        line("choices", n=2, logprobs=True, top_logprobs=1, stream=False, user="u"),
        encode_request(structs.replace(chat(7), sampling=SamplingParams(n=3, logprobs=True))),
        (unknown, headers),
        (value, headers),
    ]
    publish_raw(config, records)
    with running_worker(config):
        results = {r.custom_id: r for r in read_results(config, len(records))}
    params = {k: (r.error.code, r.error.param) for k, r in results.items() if r.error}
    assert params == {
        "stream": (4002, "stream"),
        "tools": (4002, "tools"),
        "future": (4002, "some_future_field"),
        "bad-schema": (4002, "response_format"),
        "req-6": (4002, "100"),
    }
    assert [c.text for c in results["choices"].choices] == ["hi", "hi"]
    assert results["choices"].logprobs is not None and len(results["choices"].logprobs) == 2
    assert len(results["req-7"].choices) == 3 and results["req-5"].status == "completed"
    assert results["format"].text == "{}"


def test_prefetch_bounds_in_flight_requests_under_a_backlog(kafka_config: Config) -> None:
    config = echo_config(kafka_config, prefetch_count=64, max_batch_size=16, adaptive=False)
    n = 5000
    publish(config, (chat(i) for i in range(n)))
    slow = EchoEngine(delay_per_batch_s=0.01)
    with running_worker(config, slow) as worker:
        results = read_results(config, n, timeout_s=240)
        peak = worker.admission.peak
    assert len({r.custom_id for r in results}) == n
    assert 0 < peak <= 64
