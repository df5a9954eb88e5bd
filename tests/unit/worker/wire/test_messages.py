"""The request and result types are frozen msgspec Structs that behave as the frozen
dataclasses they replaced: equality, hashing, repr, immutability, pickling, copies."""

from __future__ import annotations

import pickle
from types import MappingProxyType
from typing import cast

import pytest
from msgspec import structs

from worker.wire.messages import (
    ChatMessage,
    InferenceRequest,
    InferenceResult,
    ResponseFormat,
    SamplingParams,
    TokenLogprob,
    Usage,
)


def test_equal_values_compare_and_hash_equal_and_others_differ() -> None:
    stop = SamplingParams(max_tokens=5, stop=("a",), response_format=ResponseFormat("json_object"))
    assert stop == SamplingParams(
        max_tokens=5, stop=("a",), response_format=ResponseFormat("json_object")
    )
    assert hash(stop) == hash(
        SamplingParams(5, stop=("a",), response_format=ResponseFormat("json_object"))
    )
    assert stop != SamplingParams(max_tokens=6, stop=("a",))
    assert {ChatMessage("user", "x"), ChatMessage("user", "x")} == {ChatMessage("user", "x")}
    assert InferenceRequest("a", metadata=MappingProxyType({"k": "v"})) == InferenceRequest(
        "a", metadata=MappingProxyType({"k": "v"})
    )
    assert InferenceResult("a") != InferenceResult("b")
    assert Usage() != cast(object, (0, 0, 0))  # another type is never equal, as before
    with pytest.raises(TypeError):  # a read-only mapping field makes it unhashable, as before
        hash(InferenceRequest("a"))


def test_repr_names_every_field_in_order() -> None:
    assert repr(ChatMessage("user", "hi")) == "ChatMessage(role='user', content='hi')"
    text = repr(InferenceResult("r", usage=Usage(1, 2)))
    assert text.startswith("InferenceResult(custom_id='r', batch_id='', batch_total=0, metadata=")
    assert "usage=Usage(prompt_tokens=1, completion_tokens=2, reasoning_tokens=0)" in text


def test_frozen_and_copied_with_changes_by_structs_replace() -> None:
    request = InferenceRequest("a", messages=(ChatMessage("user", "x"),), priority=3)
    with pytest.raises(AttributeError):
        request.custom_id = "b"  # type: ignore[misc]
    changed = structs.replace(request, batch_id="b", batch_total=2)
    assert (changed.batch_id, changed.batch_total, changed.priority) == ("b", 2, 3)
    assert (request.batch_id, request.batch_total) == ("", 0)
    assert changed.messages is request.messages
    assert SamplingParams.__struct_fields__[:2] == ("max_tokens", "temperature")
    assert dict(InferenceRequest("a").metadata) == {}


def test_values_without_a_mapping_survive_pickle() -> None:
    values = [
        SamplingParams(
            seed=7, stop=("x", "y"), response_format=ResponseFormat("json_schema", "{}")
        ),
        TokenLogprob("a", -0.5, (TokenLogprob("b", -1.0),)),
        ChatMessage("system", "be brief"),
    ]
    for value in values:
        assert pickle.loads(pickle.dumps(value)) == value
