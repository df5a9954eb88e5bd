"""worker.wire.codec and worker.wire.compression: round trips, and every kind of bad record."""

from __future__ import annotations

import io
import json
import tracemalloc
from types import MappingProxyType

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from msgspec import structs

from worker.config import LimitsConfig
from worker.errors import ErrorCode, RequestError
from worker.wire.batchline import request_to_line
from worker.wire.codec import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    REQUEST_CONTENT_TYPE,
    RESULT_CONTENT_TYPE,
    CodecLimits,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from worker.wire.compression import ZSTD_MAGIC, inflate
from worker.wire.messages import (
    ChatMessage,
    Choice,
    ErrorInfo,
    InferenceRequest,
    InferenceResult,
    ResponseFormat,
    SamplingParams,
    Timings,
    TokenLogprob,
    Usage,
)
from worker.wire.validation import INT32_MAX, INT64_MAX, INT64_MIN, MAX_STOP, ROLES, nesting

LIMITS = CodecLimits(max_message_bytes=64 * 1024, max_decompressed_bytes=1 << 20)
JSON_HEADERS = [(CONTENT_TYPE, JSON_CONTENT_TYPE.encode())]
ZSTD_JSON_HEADERS = [*JSON_HEADERS, (CONTENT_ENCODING, b"zstd")]


def make_request(**overrides: object) -> InferenceRequest:
    fields: dict[str, object] = {
        "custom_id": "req-1",
        "batch_id": "batch-9",
        "batch_total": 3,
        "model": "smollm2-135m-instruct",
        "messages": (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")),
        "sampling": SamplingParams(max_tokens=32, temperature=0.0, stop=("\n",)),
        "enable_thinking": False,
        "metadata": MappingProxyType({"team": "search"}),
        "deadline": 1_767_225_600.5,
    }
    fields.update(overrides)
    return InferenceRequest(**fields)  # type: ignore[arg-type]


def zstd_stream(total: int, *, declare: bool, chunk: bytes = bytes(1 << 20)) -> bytes:
    """A zstd frame of ``total`` zero bytes, written without holding them in memory."""
    out = io.BytesIO()
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=declare)
    with cctx.stream_writer(out, size=total if declare else -1, closefd=False) as writer:
        for _ in range(total // len(chunk)):
            writer.write(chunk)
    return out.getvalue()


def expect_error(code: ErrorCode, value: bytes | None, headers: object = None) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode_request(value, headers, LIMITS)  # type: ignore[arg-type]
    assert info.value.code == code, info.value.message
    return info.value


# --- strategies -------------------------------------------------------------------------


def finite(low: float, high: float, *, exclude_min: bool = False) -> st.SearchStrategy[float]:
    return st.floats(low, high, exclude_min=exclude_min, allow_nan=False, allow_infinity=False)


texts = st.text(max_size=40)


def optional(strategy: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.none() | strategy


samplings = st.builds(
    SamplingParams,
    max_tokens=optional(st.integers(1, INT32_MAX)),
    temperature=optional(finite(0, 2)),
    top_p=optional(finite(0, 1, exclude_min=True)),
    top_k=optional(st.integers(0, INT32_MAX)),
    seed=optional(st.integers(INT64_MIN, INT64_MAX)),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=MAX_STOP).map(tuple),
    presence_penalty=optional(finite(-2, 2)),
    frequency_penalty=optional(finite(-2, 2)),
    repetition_penalty=optional(finite(0, 10, exclude_min=True)),
    n=optional(st.integers(1, 128)),
    # the pairs both endpoints can carry (completions' logprobs is the count)
    logprobs=st.just(None),
).flatmap(
    lambda s: st.sampled_from([None, *range(6)]).map(
        lambda k: s if k is None else structs.replace(s, logprobs=True, top_logprobs=k)
    )
)
messages = st.lists(
    st.builds(ChatMessage, st.sampled_from(sorted(ROLES)), texts), min_size=1, max_size=4
).map(tuple)
token_ids = st.lists(st.integers(0, INT32_MAX), min_size=1, max_size=20).map(tuple)
metadata = st.dictionaries(texts, texts, max_size=4).map(MappingProxyType)
unix_times = optional(finite(0, 4e9))
requests = st.one_of(
    st.builds(make_request, messages=messages),
    st.builds(make_request, messages=st.just(()), prompt=texts),
    st.builds(make_request, messages=st.just(()), prompt_token_ids=token_ids),
).flatmap(
    lambda base: st.builds(
        InferenceRequest,
        custom_id=st.text(min_size=1, max_size=40),
        batch_id=texts,
        batch_total=st.integers(0, INT32_MAX),
        model=texts,
        messages=st.just(base.messages),
        prompt=st.just(base.prompt),
        prompt_token_ids=st.just(base.prompt_token_ids),
        sampling=samplings,
        enable_thinking=optional(st.booleans()),
        metadata=metadata,
        priority=st.integers(-INT32_MAX - 1, INT32_MAX),
        deadline=unix_times,
        submitted_at=unix_times,
    )
)
counts = st.integers(0, INT32_MAX)
results = st.builds(
    InferenceResult,
    custom_id=st.text(min_size=1, max_size=40),
    batch_id=texts,
    batch_total=counts,
    metadata=metadata,
    text=st.text(max_size=200),
    finish_reason=st.sampled_from(["stop", "length"]),
    usage=st.builds(Usage, counts, counts, counts),
    timings=st.builds(Timings, *[finite(0, 1e6)] * 3),
    batch_size=st.integers(0, 1024),
    model=texts,
    worker_id=texts,
    created_at=finite(0, 4e9),
    endpoint=st.sampled_from(["chat", "completions"]),
) | st.builds(
    InferenceResult,
    custom_id=st.text(min_size=1, max_size=40),
    metadata=metadata,
    status=st.just("failed"),
    finish_reason=st.just("error"),
    error=st.builds(ErrorInfo, st.sampled_from([int(c) for c in ErrorCode]), texts, texts),
)


# --- round trips ------------------------------------------------------------------------


@given(requests)
def test_request_round_trips_through_protobuf_and_zstd(req: InferenceRequest) -> None:
    value, headers = encode_request(req)
    assert value.startswith(ZSTD_MAGIC)
    assert zstandard.get_frame_parameters(value).content_size > 0  # declared in the header
    assert decode_request(value, headers, LIMITS) == req


@given(requests)
def test_request_round_trips_through_a_json_batch_line(req: InferenceRequest) -> None:
    value = json.dumps(request_to_line(req)).encode()
    assert decode_request(value, JSON_HEADERS, LIMITS) == req
    compressed = zstandard.ZstdCompressor().compress(value)
    assert decode_request(compressed, ZSTD_JSON_HEADERS, LIMITS) == req


@given(results)
def test_result_round_trips_through_protobuf_and_zstd(res: InferenceResult) -> None:
    value, headers = encode_result(res)
    assert dict(headers)[CONTENT_TYPE] == RESULT_CONTENT_TYPE.encode()
    assert decode_result(value, headers) == res


def test_unset_sampling_values_stay_unset_not_zero() -> None:
    req = make_request(sampling=SamplingParams(), enable_thinking=None, deadline=None)
    decoded = decode_request(*encode_request(req), LIMITS)
    assert decoded.sampling.temperature is None and decoded.sampling.max_tokens is None
    assert decoded.enable_thinking is None and decoded.deadline is None
    zeroed = make_request(sampling=SamplingParams(temperature=0.0, seed=0), enable_thinking=False)
    assert decode_request(*encode_request(zeroed), LIMITS).sampling.seed == 0


def test_headers_are_sniffed_when_missing() -> None:
    req = make_request()
    value, _ = encode_request(req)
    assert decode_request(value, None, LIMITS) == req
    assert decode_request(zstandard.decompress(value), [], LIMITS) == req  # bare protobuf
    line = (
        b'  {"custom_id": "j", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}'
    )
    assert decode_request(line, None, LIMITS).prompt == "x"
    assert decode_request(zstandard.ZstdCompressor().compress(line), None, LIMITS).custom_id == "j"


def test_header_names_are_case_insensitive_and_values_may_be_text() -> None:
    req = make_request()
    value, _ = encode_request(req)
    headers = [("Content-Type", REQUEST_CONTENT_TYPE), ("Content-Encoding", "ZSTD")]
    assert decode_request(value, headers, LIMITS) == req


def test_limits_come_from_the_configuration() -> None:
    limits = CodecLimits.from_config(LimitsConfig(max_message_bytes=10, max_decompressed_bytes=20))
    assert limits == CodecLimits(max_message_bytes=10, max_decompressed_bytes=20)


def test_output_options_round_trip_through_protobuf_and_json() -> None:
    sampling = SamplingParams(
        n=3,
        logprobs=True,
        top_logprobs=20,
        response_format=ResponseFormat("json_schema", '{"type": "object"}', "thing", True),
    )
    req = make_request(sampling=sampling)
    assert decode_request(*encode_request(req), LIMITS) == req
    line = json.dumps(request_to_line(req)).encode()
    assert decode_request(line, JSON_HEADERS, LIMITS) == req
    chat_flag = make_request(sampling=SamplingParams(logprobs=False))
    assert decode_request(*encode_request(chat_flag), LIMITS) == chat_flag


def test_choices_and_logprobs_round_trip_in_results() -> None:
    token = TokenLogprob("a", -0.5, (TokenLogprob("a", -0.5), TokenLogprob("b", -1.5)))
    res = InferenceResult(
        "r",
        text="a",
        logprobs=(token,),
        extra_choices=(Choice("b", "length", ()), Choice("c", "stop", None)),
    )
    assert decode_result(*encode_result(res)) == res
    assert [c.text for c in res.choices] == ["a", "b", "c"]


def protobuf_with(extra: bytes, custom_id: str) -> bytes:
    """The zstd record of a protobuf request for ``custom_id`` with ``extra`` bytes appended
    (protobuf merges a repeated embedded message field into the first)."""
    value, _ = encode_request(InferenceRequest(custom_id, prompt="x"))
    return zstandard.ZstdCompressor().compress(inflate(value, 1 << 20) + extra)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (``payload`` under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_unknown_protobuf_fields_are_4002_naming_them() -> None:
    """A newer producer's field this worker does not know is refused, never ignored."""
    unknown = bytes([0xA0, 0x06, 0x01])  # field 100, varint 1
    for extra, param in ((unknown, "100"), (field(8, unknown), "sampling.100")):
        error = expect_error(ErrorCode.INVALID_PARAMETER, protobuf_with(extra, "u-1"))
        assert (error.custom_id, error.param) == ("u-1", param)


def test_unknown_response_format_type_in_protobuf_is_4002() -> None:
    xml = field(8, field(13, field(1, b"xml")))  # sampling.response_format.type
    error = expect_error(ErrorCode.INVALID_PARAMETER, protobuf_with(xml, "u-2"))
    assert (error.custom_id, error.param) == ("u-2", "response_format")


# --- bad records ------------------------------------------------------------------------


def test_undecodable_zstd_is_4001() -> None:
    expect_error(ErrorCode.MALFORMED, ZSTD_MAGIC + b"not really zstd at all")
    expect_error(ErrorCode.MALFORMED, b"plain bytes", [(CONTENT_ENCODING, b"zstd")])


def test_truncated_or_padded_zstd_frame_is_4001() -> None:
    value, headers = encode_request(make_request())
    expect_error(ErrorCode.MALFORMED, value[:-3], headers)
    expect_error(ErrorCode.MALFORMED, value + value, headers)
    undeclared = zstandard.ZstdCompressor(write_content_size=False).compress(b"{}" * 100)
    assert inflate(undeclared, 1 << 10) == b"{}" * 100
    for bad in (undeclared[:-2], undeclared + b"junk"):
        with pytest.raises(RequestError) as info:
            inflate(bad, 1 << 10)
        assert info.value.code == ErrorCode.MALFORMED


def test_truncated_protobuf_is_4001() -> None:
    value, headers = encode_request(make_request())
    serialized = zstandard.decompress(value)
    truncated = zstandard.ZstdCompressor().compress(serialized[:-1])
    error = expect_error(ErrorCode.MALFORMED, truncated, headers)
    assert error.custom_id is None


def test_json_that_is_not_a_batch_line_is_4001() -> None:
    expect_error(ErrorCode.MALFORMED, b"{not json", JSON_HEADERS)
    expect_error(ErrorCode.MALFORMED, b"[1, 2]", JSON_HEADERS)
    error = expect_error(ErrorCode.MALFORMED, b'{"custom_id": "k", "body": {}}', JSON_HEADERS)
    assert error.custom_id == "k"


def test_missing_custom_id_is_4001_without_an_id() -> None:
    value, headers = encode_request(make_request(custom_id=""))
    assert expect_error(ErrorCode.MALFORMED, value, headers).custom_id is None
    line = json.dumps({**request_to_line(make_request()), "custom_id": ""}).encode()
    assert expect_error(ErrorCode.MALFORMED, line, JSON_HEADERS).custom_id is None


def test_invalid_parameter_is_4002_and_keeps_the_custom_id() -> None:
    bad = make_request(sampling=SamplingParams(temperature=-1.0))
    assert expect_error(ErrorCode.INVALID_PARAMETER, *encode_request(bad)).custom_id == "req-1"
    line = json.dumps(request_to_line(bad)).encode()
    assert expect_error(ErrorCode.INVALID_PARAMETER, line, JSON_HEADERS).custom_id == "req-1"


@pytest.mark.parametrize(
    "schema",
    [
        "[" * 3_000,  # past the parser's recursion limit
        '{"a":' * 3_000,
        # parses, but nests 801 deep: refused before the schema checker recurses through it
        '{"type":"object","properties":'
        + '{"a":{"type":"object","properties":' * 400
        + "{}"
        + "}}" * 400
        + "}",
    ],
)
def test_a_schema_nested_too_deep_is_4002_not_a_crash(schema: str) -> None:
    fmt = ResponseFormat("json_schema", schema, "deep")
    bad = make_request(sampling=SamplingParams(response_format=fmt))
    error = expect_error(ErrorCode.INVALID_PARAMETER, *encode_request(bad))
    assert (error.custom_id, error.param) == ("req-1", "response_format")
    assert nesting(json.loads('{"a": [1, {"b": []}], "c": 2}')) == 4
    assert nesting(7) == 0


def test_unknown_content_type_or_encoding_is_4001() -> None:
    value, _ = encode_request(make_request())
    for headers in (
        [(CONTENT_TYPE, b"text/plain")],
        [(CONTENT_TYPE, RESULT_CONTENT_TYPE.encode())],
        [(CONTENT_ENCODING, b"gzip")],
    ):
        expect_error(ErrorCode.MALFORMED, value, headers)


def test_record_without_value_is_4001() -> None:
    expect_error(ErrorCode.MALFORMED, None, None)


def test_oversize_message_is_4003_before_decoding() -> None:
    at_limit = b" " * (LIMITS.max_message_bytes - 2) + b"{}"
    expect_error(ErrorCode.MALFORMED, at_limit, JSON_HEADERS)  # passes the size check
    expect_error(ErrorCode.OVER_LIMIT, at_limit + b" ", JSON_HEADERS)


def test_zstd_frame_declaring_a_huge_size_is_4003_before_inflating() -> None:
    # Frame header: 8-byte content size field, 1 MiB window, declaring 1 TiB; then one
    # RLE block. Nothing beyond the header is ever read.
    header = ZSTD_MAGIC + bytes([0xC0, 0x50]) + (1 << 40).to_bytes(8, "little")
    expect_error(ErrorCode.OVER_LIMIT, header + bytes([0x13, 0x00, 0x00, 0x00]))
    honest_bomb = zstd_stream(64 << 20, declare=True)
    assert zstandard.get_frame_parameters(honest_bomb).content_size == 64 << 20
    expect_error(ErrorCode.OVER_LIMIT, honest_bomb, ZSTD_JSON_HEADERS)


def test_zstd_bomb_without_declared_size_stops_at_the_cap() -> None:
    bomb = zstd_stream(64 << 20, declare=False)
    assert len(bomb) < LIMITS.max_message_bytes
    tracemalloc.start()
    try:
        expect_error(ErrorCode.OVER_LIMIT, bomb, ZSTD_JSON_HEADERS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the cap (1 MiB) plus one step, not the 64 MiB it inflates to


def test_zstd_frame_needing_a_huge_window_is_4003() -> None:
    header = ZSTD_MAGIC + bytes([0x00, 0xA0])  # no content size, 1 GiB window
    expect_error(ErrorCode.OVER_LIMIT, header + bytes([0x13, 0x00, 0x00, 0x00]))


def test_result_decoding_rejects_inconsistent_results() -> None:
    failed_without_error = InferenceResult("r", status="failed", finish_reason="error")
    with pytest.raises(RequestError) as info:
        decode_result(*encode_result(failed_without_error))
    assert (info.value.code, info.value.custom_id) == (ErrorCode.MALFORMED, "r")
    with pytest.raises(RequestError):
        decode_result(*encode_request(make_request()))
    with pytest.raises(RequestError):
        decode_result(b'{"custom_id": "r"}', JSON_HEADERS)


def _decoded_sampling(sampling: SamplingParams, custom_id: str = "c") -> SamplingParams:
    request = InferenceRequest(custom_id, messages=(ChatMessage("user", "hi"),), sampling=sampling)
    return decode_request(*encode_request(request), LIMITS).sampling


def test_requests_asking_for_the_same_settings_share_one_decoded_value() -> None:
    """Settings are decoded once per distinct message (issue 42): equal bytes, one value."""
    a = _decoded_sampling(SamplingParams(max_tokens=64, stop=("x",)), "a")
    b = _decoded_sampling(SamplingParams(max_tokens=64, stop=("x",)), "b")
    other = _decoded_sampling(SamplingParams(max_tokens=65, stop=("x",)))
    assert a is b and a == SamplingParams(max_tokens=64, stop=("x",))
    assert other == SamplingParams(max_tokens=65, stop=("x",))


def test_the_shared_settings_are_bounded_and_a_long_schema_is_not_kept() -> None:
    from worker.wire import codec

    for i in range(codec._SAMPLINGS_KEPT + 5):
        assert _decoded_sampling(SamplingParams(max_tokens=1 + i)).max_tokens == 1 + i
    assert len(codec._SAMPLINGS) <= codec._SAMPLINGS_KEPT
    schema = json.dumps({"type": "object", "description": "x" * 2000})
    fmt = ResponseFormat("json_schema", schema, "big")
    long = _decoded_sampling(SamplingParams(response_format=fmt))
    assert long.response_format == fmt
    assert _decoded_sampling(SamplingParams(response_format=fmt)) is not long


def test_shared_settings_are_range_checked_once_and_bad_ones_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """validate_request checks a settings value it has passed before (the same object, as
    the codec shares it: ``shared``) only once; a value out of range fails every request;
    a value not said to be shared (a JSON line's own) is checked every time."""
    from worker.wire import validation

    checked: list[SamplingParams] = []
    check = validation._check_sampling

    def counting(req: InferenceRequest, s: SamplingParams) -> None:
        checked.append(s)
        check(req, s)

    monkeypatch.setattr(validation, "_check_sampling", counting)
    good = SamplingParams(max_tokens=7, top_k=5)
    bad = SamplingParams(max_tokens=7, top_p=0.0)
    own = SamplingParams(max_tokens=7, top_k=5)
    for i in range(3):
        validation.validate_request(
            InferenceRequest(f"c{i}", prompt="p", sampling=good), shared=True
        )
        with pytest.raises(RequestError) as caught:
            validation.validate_request(
                InferenceRequest(f"b{i}", prompt="p", sampling=bad), shared=True
            )
        assert (caught.value.param, caught.value.custom_id) == ("top_p", f"b{i}")
        validation.validate_request(InferenceRequest(f"o{i}", prompt="p", sampling=own))
    equal = SamplingParams(max_tokens=7, top_k=5)  # another object: checked again
    validation.validate_request(InferenceRequest("e", prompt="p", sampling=equal), shared=True)
    assert [s is good for s in checked].count(True) == 1
    assert [s is bad for s in checked].count(True) == 3
    assert [s is own for s in checked].count(True) == 3
    assert any(s is equal for s in checked)
