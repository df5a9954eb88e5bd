"""The tables that share request settings keep only small ones: a tenant can make a schema,
stop strings or a content-type megabytes long, and a table keeps what it holds after the
requests are answered (review s4, #4 and #5)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from batcher import Pending
from tests.unit.worker.test_intake import DEFAULTS, StrictEcho
from worker.config import BatchingConfig
from worker.engines.base import ResolvedSampling
from worker.engines.echo import EchoEngine
from worker.errors import RequestError
from worker.loop.intake import Intake, Rejection
from worker.loop.jobs import Identity, Source
from worker.wire import codec, validation
from worker.wire.codec import CodecLimits, decode_request, encode_request
from worker.wire.messages import (
    SETTINGS_KEPT_BYTES,
    ChatMessage,
    InferenceRequest,
    ResponseFormat,
    SamplingParams,
    keeps,
)

MIB = 1 << 20
LIMITS = CodecLimits(2 * MIB, 2 * MIB)
REQUESTS = 300  # more than any table keeps
offsets = itertools.count()


def schema(i: int, size: int = MIB) -> str:
    """A distinct JSON Schema of about ``size`` characters."""
    return json.dumps({"type": "object", "description": f"{i}" + "x" * size})


def line(i: int, fmt_schema: str, **body: Any) -> bytes:
    """A JSON batch line (the JSON path: a new settings value per request)."""
    return json.dumps(
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "echo",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": json.loads(fmt_schema)},
                },
                **body,
            },
        }
    ).encode()


JSON_HEADERS = [("content-type", b"application/json")]


@pytest.fixture(autouse=True)
def fresh_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "_CHECKED", {})
    monkeypatch.setattr(codec, "_SAMPLINGS", {})
    codec._json_media.cache_clear()


def kept_chars(values: list[SamplingParams]) -> int:
    """The schema and stop characters ``values`` hold."""
    return sum(len(s.response_format.schema) + sum(map(len, s.stop)) for s in values)


def test_the_size_rule_counts_schema_name_and_stop() -> None:
    assert keeps(SamplingParams(stop=("x" * SETTINGS_KEPT_BYTES,)))
    assert not keeps(SamplingParams(stop=("x" * SETTINGS_KEPT_BYTES, "y")))
    fmt = ResponseFormat("json_schema", "x" * SETTINGS_KEPT_BYTES, "s")
    assert not keeps(SamplingParams(response_format=fmt))


def test_json_requests_with_long_schemas_leave_nothing_large_kept_and_are_answered_alike() -> None:
    engine = EchoEngine()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), DEFAULTS, LIMITS)
    for i in range(REQUESTS):  # a quarter MiB each: the JSON path reads each twice
        long = schema(i, MIB // 4)
        value = line(i, long, seed=7)
        outcome = intake.take(Source("requests", 0, next(offsets)), value, JSON_HEADERS, 0.0)
        fmt = ResponseFormat("json_schema", long, "s")
        asked = SamplingParams(seed=7, response_format=fmt)
        assert isinstance(outcome, Pending), outcome
        assert outcome.payload.engine_input.sampling == ResolvedSampling.resolve(
            asked, None, DEFAULTS
        )
    assert kept_chars([s for s, _ in intake._resolved]) == 0
    assert kept_chars(list(validation._CHECKED.values())) == 0


def test_a_long_schema_refused_by_the_engine_is_refused_for_every_request_alike() -> None:
    engine = StrictEcho()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), DEFAULTS, LIMITS)
    long = schema(0, 4 * SETTINGS_KEPT_BYTES)
    errors = []
    for i in range(3):  # the same long setting: resolved and refused each time
        outcome = intake.take(Source("requests", 0, next(offsets)), line(i, long), JSON_HEADERS, 0)
        assert isinstance(outcome, Rejection), outcome
        error = outcome.result.error
        assert error is not None and outcome.result.custom_id == f"c{i}"
        errors.append((error.code, error.param, error.message))
    assert errors[0][:2] == (4002, "response_format") and len(set(errors)) == 1
    assert not intake._resolved


def test_protobuf_requests_with_long_schemas_leave_nothing_large_kept() -> None:
    for i in range(REQUESTS):
        fmt = ResponseFormat("json_schema", schema(i), "s")
        request = InferenceRequest(
            f"c{i}",
            messages=(ChatMessage("user", "hi"),),
            sampling=SamplingParams(response_format=fmt),
        )
        assert decode_request(*encode_request(request), LIMITS) == request
    assert kept_chars(list(validation._CHECKED.values())) == 0
    assert kept_chars(list(codec._SAMPLINGS.values())) == 0


def test_json_requests_do_not_push_the_shared_protobuf_settings_out() -> None:
    request = InferenceRequest(
        "p", messages=(ChatMessage("user", "hi"),), sampling=SamplingParams(max_tokens=9)
    )
    shared = decode_request(*encode_request(request), LIMITS).sampling
    assert {id(shared): shared} == validation._CHECKED
    for i in range(REQUESTS):  # each a new value that never recurs: checked, not kept
        value = line(i, schema(i, 10), max_tokens=1 + i)
        assert decode_request(value, JSON_HEADERS, LIMITS).sampling.max_tokens == 1 + i
    assert {id(shared): shared} == validation._CHECKED


def test_a_long_content_type_is_read_but_not_kept() -> None:
    value = line(0, schema(0, 10))
    for i in range(REQUESTS):
        long = f"application/json; x={i}{'y' * 64 * 1024}".encode()
        assert decode_request(value, [("content-type", long)], LIMITS).custom_id == "c0"
    assert codec._json_media.cache_info().currsize == 0
    bad = f"text/plain; x={'y' * 1024}"
    with pytest.raises(RequestError) as long_error:
        decode_request(value, [("content-type", bad.encode())], LIMITS)
    with pytest.raises(RequestError) as short_error:
        decode_request(value, [("content-type", b"text/plain")], LIMITS)
    assert (long_error.value.code, long_error.value.message) == (
        short_error.value.code,
        short_error.value.message.replace("'text/plain'", repr(bad)),
    )
