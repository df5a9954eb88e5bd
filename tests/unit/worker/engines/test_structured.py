"""Structured outputs (response_format): echo's minimal instances, hf's xgrammar guidance."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest

from tests.unit.conftest import resolved
from worker.config import EngineConfig
from worker.engines.base import Completion, EngineInput, StaticEngine
from worker.engines.echo import EchoEngine
from worker.engines.hf.engine import HFEngine
from worker.engines.minimal_json import NoInstance, minimal_instance
from worker.errors import ErrorCode, RequestError
from worker.wire.batchline import parse_line
from worker.wire.messages import ChatMessage, InferenceRequest, ResponseFormat, SamplingParams

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {
        "type": "object",
        "properties": {
            "who": {
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 6}},
                "required": ["name"],
            },
            "mood": {"enum": ["happy", "sad"]},
            "score": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 1},
            "votes": {"type": "integer", "minimum": 3, "maximum": 9},
            "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
        },
        "required": ["who", "mood", "score", "votes", "tags"],
    },
    {
        "$defs": {
            "leaf": {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"]}
        },
        "type": "object",
        "properties": {"leaf": {"$ref": "#/$defs/leaf"}, "n": {"type": ["null", "integer"]}},
        "required": ["leaf", "n"],
    },
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}},
]


def fmt(schema: dict[str, Any], strict: bool | None = True) -> ResponseFormat:
    return ResponseFormat("json_schema", json.dumps(schema), "s", strict)


def ask(
    engine: StaticEngine, key: str, response_format: ResponseFormat, **sampling: Any
) -> EngineInput:
    request = InferenceRequest(
        key,
        messages=(ChatMessage("user", "Describe it as JSON."),),
        sampling=SamplingParams(response_format=response_format),
    )
    params = resolved(
        **{"max_tokens": 120, "temperature": 0.0, "response_format": response_format, **sampling}
    )
    return EngineInput(key, engine.encode(request), params)


def run(engine: StaticEngine, *inputs: EngineInput) -> dict[str, Completion]:
    done: list[Completion] = []
    engine.run_batch(inputs, done.append)
    return {c.key: c for c in done}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_minimal_instances_validate(schema: dict[str, Any]) -> None:
    jsonschema.validate(minimal_instance(schema), schema)


def test_a_schema_without_a_minimal_instance_is_refused_naming_why() -> None:
    with pytest.raises(NoInstance, match="does not match"):
        minimal_instance({"type": "string", "pattern": "^x+$"})
    engine = EchoEngine()
    with pytest.raises(RequestError) as info:
        ask(
            engine,
            "k",
            fmt({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}),
        )
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")


def test_echo_answers_the_minimal_valid_instance() -> None:
    engine = EchoEngine()
    done = run(engine, *(ask(engine, f"k{i}", fmt(s)) for i, s in enumerate(SCHEMAS)))
    for i, schema in enumerate(SCHEMAS):
        jsonschema.validate(json.loads(done[f"k{i}"].text), schema)
    obj = run(engine, ask(engine, "o", ResponseFormat("json_object")))["o"]
    assert obj.text == "{}"


def test_an_invalid_json_schema_is_refused_at_validation() -> None:
    line = {
        "custom_id": "v",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": 5}},
            },
        },
    }
    with pytest.raises(RequestError) as info:
        parse_line(line)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")
    assert "not a valid JSON Schema" in info.value.message


def char_llama() -> tuple[Any, Any]:
    """A random-weight Llama over a character-level vocabulary, so JSON can be spelt."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = ["<unk>", "<pad>", "<s>", "</s>", *string.printable[:95]]
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(chars)}, [], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(chars),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=1,
    )
    return LlamaForCausalLM(config), tokenizer  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def char_engine() -> Any:
    engine = HFEngine(EngineConfig(model="char", device="cpu"), preloaded=char_llama())
    engine.load()
    yield engine
    engine.close()


def test_hf_guided_rows_follow_their_schema_and_free_rows_are_untouched(
    char_engine: HFEngine,
) -> None:
    bounded = {
        "type": "object",
        "properties": {
            "mood": {"enum": ["happy", "sad"]},
            "votes": {"type": "integer", "minimum": 3, "maximum": 9},
            "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
        },
        "required": ["mood", "votes", "flags"],
    }
    free = ask(char_engine, "free", ResponseFormat(), max_tokens=20)
    done = run(
        char_engine,
        ask(char_engine, "greedy", fmt(bounded)),
        ask(char_engine, "sampled", fmt(bounded), temperature=1.0, seed=4),
        free,
    )
    for key in ("greedy", "sampled"):
        assert done[key].finish_reason == "stop", done[key]
        jsonschema.validate(json.loads(done[key].text), bounded)
    alone = run(char_engine, free)["free"]
    assert (done["free"].text, done["free"].completion_tokens) == (
        alone.text,
        alone.completion_tokens,
    )


def test_hf_refuses_a_schema_xgrammar_cannot_compile_naming_the_problem(
    char_engine: HFEngine,
) -> None:
    bad = fmt({"type": "integer", "minimum": 5, "maximum": 1})
    with pytest.raises(RequestError) as info:
        ask(char_engine, "bad", bad)
    assert (info.value.code, info.value.param) == (ErrorCode.INVALID_PARAMETER, "response_format")
    assert "minimum greater than maximum" in info.value.message


@pytest.mark.model
def test_smollm2_answers_valid_json_for_each_schema(hf_engine: HFEngine) -> None:
    inputs = [ask(hf_engine, f"k{i}", fmt(s)) for i, s in enumerate(SCHEMAS)]
    inputs.append(ask(hf_engine, "obj", ResponseFormat("json_object"), max_tokens=60))
    assert_follow_their_schemas(run(hf_engine, *inputs))


def assert_follow_their_schemas(done: Mapping[str, Completion]) -> None:
    """``done`` answers ``k{i}`` with ``SCHEMAS[i]`` and ``obj`` with ``json_object``:
    each finished answer validates, one cut at ``max_tokens`` is the JSON's beginning."""
    finished = 0
    for i, schema in enumerate(SCHEMAS):
        out = done[f"k{i}"]
        assert out.error is None
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)
            finished += 1
        else:  # a tiny greedy model can loop inside a string until max_tokens: a prefix
            assert out.finish_reason == "length" and out.text.startswith(("{", "["))
    assert finished >= len(SCHEMAS) // 2
    if done["obj"].finish_reason == "stop":
        assert isinstance(json.loads(done["obj"].text), dict)
    else:  # cut at max_tokens, as OpenAI's json_object can be: still an object's prefix
        assert done["obj"].text.startswith("{")
