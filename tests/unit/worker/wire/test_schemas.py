"""schemas/*.json: well-formed, agreeing with the parser, the formatters and the config."""

from __future__ import annotations

import json
from dataclasses import fields
from types import MappingProxyType
from typing import Any

import jsonschema
import pytest
from msgspec import structs

from tests import ROOT
from worker.config import Config, ConfigError, load_config
from worker.errors import ErrorCode, RequestError
from worker.wire.answers import format_error_line, format_output_line
from worker.wire.batchline import parse_line
from worker.wire.messages import Endpoint, ErrorInfo, FinishReason, InferenceResult, Usage

EXAMPLES = ROOT / "examples" / "requests.jsonl"


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


INPUT, OUTPUT, ERROR = (
    validator(n) for n in ("batch-input-line", "batch-output-line", "batch-error-line")
)

CHAT: dict[str, Any] = {
    "custom_id": "s-1",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32},
}
GOOD_LINES = [
    CHAT,
    {**CHAT, "metadata": {"k": "v"}, "priority": 1, "deadline": 1.5, "batch_id": "b"},
    {**CHAT, "body": {**CHAT["body"], "stop": ["\n"], "temperature": 0, "top_p": 1, "n": 1}},
    {**CHAT, "body": {**CHAT["body"], "stream": False, "stop": None, "user": "u"}},
    {**CHAT, "url": "/v1/completions", "body": {"prompt": "Once"}},
    {**CHAT, "url": "/v1/completions", "body": {"prompt": [1, 2, 3]}},
    {**CHAT, "url": "/v1/responses", "body": {"input": "Hi", "instructions": "Be brief."}},
    {
        **CHAT,
        "url": "/v1/responses",
        "body": {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}],
                }
            ],
            "max_output_tokens": 8,
            "store": False,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        },
    },
]
BAD_LINES = [
    {k: v for k, v in CHAT.items() if k != "custom_id"},
    {**CHAT, "custom_id": ""},
    {**CHAT, "method": "GET"},
    {**CHAT, "url": "/v1/embeddings"},
    {**CHAT, "body": {"model": "m"}},
    {**CHAT, "body": {**CHAT["body"], "messages": []}},
    {**CHAT, "body": {**CHAT["body"], "temperature": -1}},
    {**CHAT, "body": {**CHAT["body"], "top_p": 0}},
    {**CHAT, "body": {**CHAT["body"], "max_tokens": 0}},
    {**CHAT, "body": {**CHAT["body"], "n": 0}},
    {**CHAT, "body": {**CHAT["body"], "stream": True}},
    {**CHAT, "body": {**CHAT["body"], "some_future_field": {"x": 1}}},
    {**CHAT, "unknown_top_level_key": 1},
    {**CHAT, "metadata": {"k": 1}},
    {**CHAT, "url": "/v1/completions", "body": {"prompt": ["a"]}},
    {**CHAT, "url": "/v1/responses"},
    {**CHAT, "url": "/v1/responses", "body": {"input": "Hi", "reasoning": {"effort": "low"}}},
    {**CHAT, "url": "/v1/responses", "body": {"input": "Hi", "store": True}},
    {**CHAT, "url": "/v1/responses", "body": {"input": [{"role": "tool", "content": "x"}]}},
]


@pytest.mark.parametrize("line", GOOD_LINES)
def test_good_lines_match_the_schema_and_parse(line: dict[str, Any]) -> None:
    INPUT.validate(line)
    assert parse_line(line).custom_id == "s-1"


@pytest.mark.parametrize("line", BAD_LINES)
def test_bad_lines_fail_the_schema_and_the_parser(line: dict[str, Any]) -> None:
    assert not INPUT.is_valid(line)
    with pytest.raises(RequestError):
        parse_line(line)


def test_example_batch_file_is_valid() -> None:
    lines = EXAMPLES.read_text().splitlines()
    assert 6 <= len(lines) <= 10
    ids = set()
    for text in lines:
        INPUT.validate(json.loads(text))
        req = parse_line(text)
        assert req.sampling.max_tokens == 32 and req.sampling.temperature == 0
        assert req.metadata
        ids.add(req.custom_id)
    assert len(ids) == len(lines)


def test_formatted_lines_match_their_schemas() -> None:
    completed = InferenceResult(
        "f-1",
        metadata=MappingProxyType({"k": "v"}),
        text="ok",
        usage=Usage(3, 2, 0),
        model="m",
        created_at=1.0,
    )
    ends: tuple[tuple[Endpoint, FinishReason], ...] = (
        ("chat", "stop"),
        ("completions", "stop"),
        ("responses", "stop"),
        ("responses", "length"),
        ("chat", "content_filter"),
        ("completions", "content_filter"),
        ("responses", "content_filter"),
    )
    for endpoint, finish in ends:
        line = format_output_line(
            structs.replace(completed, endpoint=endpoint, finish_reason=finish)
        )
        OUTPUT.validate(line)
        assert not ERROR.is_valid(line)
    for code in ErrorCode:
        for param in ("", "top_p"):
            failed = InferenceResult(
                "f-2", status="failed", error=ErrorInfo(int(code), "why", param)
            )
            ERROR.validate(format_error_line(failed))
            assert not OUTPUT.is_valid(format_error_line(failed))


CONFIG = validator("worker-config")


def test_config_schema_lists_every_configuration_key() -> None:
    properties = CONFIG.schema["properties"]
    assert set(properties) == {f.name for f in fields(Config)}
    for section in fields(Config):
        assert set(properties[section.name]["properties"]) == {
            f.name for f in fields(getattr(Config(), section.name))
        }, section.name
    CONFIG.validate(Config().to_dict())


def test_kafka_client_settings_are_free_form_scalars() -> None:
    document = Config().to_dict()
    document["kafka"]["client"] = {"linger.ms": 5, "enable.idempotence": True, "acks": "all"}
    CONFIG.validate(document)
    document["kafka"]["client"] = {"linger.ms": [5]}
    assert not CONFIG.is_valid(document)


def test_load_config_accepts_the_defaults_and_applies_overrides() -> None:
    assert load_config(environ={}) == Config()
    config = load_config(environ={"BATCHPIPE_BATCHING__TIMEOUT_MS": "50"})
    assert config.batching.timeout_ms == 50
    config = load_config(
        sets=["batching.timeout_ms=50", "kafka.client.ssl.ca.location=/ca"], environ={}
    )
    assert config.batching.timeout_ms == 50
    assert config.kafka.client == {"ssl.ca.location": "/ca"}


@pytest.mark.parametrize(
    "item",
    [
        "batching.max_batch_size=0",
        "batching.timeout_ms=-1",
        "batching.adaptive=maybe",
        "engine.kind=foo",
        "engine.gpu_memory_fraction=1.5",
        "kafka.delivery=twice",
        "kafka.requests_topic=bad topic",
        "metrics.port=70000",
        "batching.unknown_key=1",
        "nonsense.key=1",
    ],
)
def test_load_config_rejects_bad_values(item: str) -> None:
    with pytest.raises(ConfigError):
        load_config(sets=[item], environ={})
