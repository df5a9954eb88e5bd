"""``/v1/embeddings`` lines: parsing, refusals, the wire round trip and the answer's shape
(read with the official SDK's ``CreateEmbeddingResponse``)."""

from __future__ import annotations

import base64
import itertools
import json
import struct
from typing import Any

import jsonschema
import pytest
from msgspec import structs

from tests import ROOT
from tests.openai_sdk import CreateEmbeddingResponse, decoded_vector, sdk_line
from worker.errors import ErrorCode, RequestError
from worker.wire.answers import encode_vector, format_output_line
from worker.wire.batchline import parse_line, request_to_line
from worker.wire.codec import (
    CodecLimits,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from worker.wire.messages import InferenceRequest, InferenceResult, SamplingParams, Usage

LIMITS = CodecLimits(1 << 20, 1 << 20)
ids = itertools.count()


def line(**body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"e-{next(ids)}",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "all-minilm-l6-v2", "input": "hello", **body},
    }


def refused(request: dict[str, Any], code: ErrorCode = ErrorCode.INVALID_PARAMETER) -> str | None:
    with pytest.raises(RequestError) as info:
        parse_line(request)
    assert info.value.code == code, info.value.message
    return info.value.param


def test_a_string_or_a_list_of_strings() -> None:
    one = parse_line(line())
    assert one.embedding_inputs == ("hello",) and one.endpoint == "embeddings"
    assert one.encoding_format == "float" and one.dimensions is None
    many = parse_line(line(input=["a", "b c"], encoding_format="base64", dimensions=384, user="u"))
    assert many.embedding_inputs == ("a", "b c")
    assert (many.encoding_format, many.dimensions) == ("base64", 384)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [1, 2, 3]}, "input"),  # token arrays: refused, not misread
        ({"input": [[1, 2], [3]]}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"encoding_format": "int8"}, "encoding_format"),
        ({"dimensions": 0}, "dimensions"),
        ({"max_tokens": 4}, "max_tokens"),  # a generation field: not in this body
        ({"messages": []}, "messages"),
        ({"metadata": {"k": "v"}}, "metadata"),
        ({"something": 1}, "something"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(line(**body)) == param


def test_malformed_input_is_4001() -> None:
    refused(line(input={"text": "x"}), ErrorCode.MALFORMED)
    no_input = line()
    del no_input["body"]["input"]
    refused(no_input, ErrorCode.MALFORMED)


def test_an_unknown_url_is_4002_naming_url() -> None:
    assert refused({**line(), "url": "/v1/rerank"}) == "url"


def test_line_and_protobuf_round_trips() -> None:
    request = parse_line(line(input=["x", "y"], encoding_format="base64", dimensions=384))
    assert parse_line(request_to_line(request)) == request
    assert decode_request(*encode_request(request), LIMITS) == request


def test_protobuf_refuses_options_of_the_other_endpoint() -> None:
    texts = InferenceRequest(custom_id="p", embedding_inputs=("x",))
    with pytest.raises(RequestError) as info:
        decode_request(
            *encode_request(structs.replace(texts, sampling=SamplingParams(n=2))), LIMITS
        )
    assert info.value.param == "n"
    chat = InferenceRequest(custom_id="c", prompt="x", encoding_format="base64")
    with pytest.raises(RequestError) as info:
        decode_request(*encode_request(chat), LIMITS)
    assert info.value.param == "encoding_format"


def result(encoding: str, vectors: tuple[tuple[float, ...], ...]) -> InferenceResult:
    return InferenceResult(
        custom_id="r",
        batch_id="b",
        model="all-minilm-l6-v2",
        endpoint="embeddings",
        usage=Usage(prompt_tokens=9),
        embeddings=vectors,
        encoding_format=encoding,  # type: ignore[arg-type]
    )


VECTORS = ((0.5, -0.25, 1.0e-3), (0.1, 0.2, -0.3))


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_the_answer_is_openais_embedding_response(encoding: str) -> None:
    res = decode_result(*encode_result(result(encoding, VECTORS)))  # float32 on the wire
    output = format_output_line(res)
    parsed = sdk_line(output)
    assert isinstance(parsed, CreateEmbeddingResponse)
    assert [e.index for e in parsed.data] == [0, 1]
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 9
    assert parsed.model == "all-minilm-l6-v2"
    for got, want in zip(parsed.data, VECTORS, strict=True):
        # the vector as float32, exactly (base64 or float, the same values)
        assert got.embedding == list(struct.unpack("<3f", struct.pack("<3f", *want)))
    schema = json.loads((ROOT / "schemas" / "batch-output-line.schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(output)), schema)


def test_base64_is_little_endian_float32() -> None:
    encoded = encode_vector((1.0, -2.5), "base64")
    assert isinstance(encoded, str)
    assert base64.b64decode(encoded) == b"\x00\x00\x80\x3f\x00\x00\x20\xc0"
    assert decoded_vector(encoded) == [1.0, -2.5]
