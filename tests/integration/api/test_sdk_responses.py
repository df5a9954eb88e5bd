"""/v1/responses batches through the official ``openai`` SDK and ``batchpipe serve``
(issue 26): a plain line, an ``instructions`` line, a ``json_schema`` line and one cut
by ``max_output_tokens``; every output body reads as the SDK's ``Response`` and the
schema line's text validates against its schema. Once on the echo engine, and once
(marker ``model``) on the default real model, SmolLM2-135M-Instruct on CPU, with vLLM and
with transformers (hf)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.integration.api.conftest import Serve
from tests.integration.api.test_sdk_model import completed_output
from tests.openai_sdk import Response, sdk_line
from worker.config import Config, EngineConfig, EngineKind

pytestmark = pytest.mark.integration

URL = "/v1/responses"
SCHEMA = {
    "type": "object",
    # bounded, so that a small model's JSON ends well within max_output_tokens
    "properties": {
        "colour": {"type": "string", "maxLength": 16},
        "count": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["colour", "count"],
    "additionalProperties": False,
}
BODIES: dict[str, dict[str, Any]] = {
    "plain": {"input": "Say hello.", "max_output_tokens": 16},
    "instructions": {
        "instructions": "Answer in one word.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}],
        "max_output_tokens": 16,
        "metadata": {"kind": "instructions"},
    },
    "schema": {
        "input": "Give a colour and a count as JSON.",
        "text": {"format": {"type": "json_schema", "name": "colour", "schema": SCHEMA}},
        "max_output_tokens": 96,
    },
    "cut": {"input": "Count from one to one hundred in words, please.", "max_output_tokens": 2},
}


def batch_file(path: Path, model: str) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": URL,
                    "body": {"model": model, **body},
                }
            )
            + "\n"
            for custom_id, body in BODIES.items()
        )
    )
    return path


def responses(output: dict[str, dict[str, Any]]) -> dict[str, Response]:
    """Every output line's body as the SDK's ``Response``, by custom_id."""
    assert sorted(output) == sorted(BODIES)
    parsed = {}
    for custom_id, line in output.items():
        body = sdk_line(line)
        assert isinstance(body, Response), custom_id
        assert body.object == "response" and body.output_text is not None
        assert body.usage is not None and body.usage.input_tokens > 0
        assert body.usage.total_tokens == body.usage.input_tokens + body.usage.output_tokens
        parsed[custom_id] = body
    cut = parsed["cut"]
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 2
    assert parsed["instructions"].metadata == {"kind": "instructions"}
    schema = parsed["schema"]
    assert schema.status == "completed"
    jsonschema.validate(json.loads(schema.output_text), SCHEMA)
    return parsed


def test_responses_batch_on_echo(api_config: Config, serve: Serve, tmp_path: Path) -> None:
    source = batch_file(tmp_path / "in.jsonl", "echo")
    parsed = responses(completed_output(api_config, serve, source, URL))
    # the echo engine answers the last user message: the instructions came before it
    assert parsed["instructions"].output_text == "Name a colour."
    assert parsed["plain"].output_text == "Say hello."
    assert parsed["plain"].usage is not None
    assert parsed["plain"].usage.output_tokens == len("Say hello.")


@pytest.mark.model
@pytest.mark.parametrize("kind", ["vllm", "hf"])
def test_responses_batch_on_the_default_model(
    api_config: Config, serve: Serve, tmp_path: Path, kind: EngineKind
) -> None:
    """vllm is what the default kind runs where vllm imports, hf where it does not."""
    config = replace(api_config, engine=EngineConfig(kind=kind))
    source = batch_file(tmp_path / "in.jsonl", config.engine.model)
    parsed = responses(completed_output(config, serve, source, URL))
    assert parsed["plain"].output_text and parsed["instructions"].output_text
