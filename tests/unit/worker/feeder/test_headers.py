"""The pending record's headers as the feeder reads them (worker/feeder/headers.py): every
value bounded, never an exception (issue 38: a 4,300-digit tokens header raised
ValueError, 10**400 overflowed the fair share, tokens=1 was charged 1/700 of a request)."""

from __future__ import annotations

import math
import time

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from batcher.fairshare import MAX_TOKENS, MAX_WEIGHT, MIN_WEIGHT
from worker.feeder.headers import (
    DEADLINE_HEADER,
    MAX_ID_CHARS,
    TOKENS_HEADER,
    WEIGHT_HEADER,
    Charging,
    Scheduled,
    scheduled_as,
)
from worker.feeder.naming import (
    COMPLETION_WINDOW_S,
    check_weight,
    pending_headers,
    tokens_header,
)

CHARGING = Charging(max_decompressed_bytes=1 << 20, max_batch_tokens=8192, default_max_tokens=256)
VALUE = b"x" * 4000  # an uncompressed record: 4,000 bytes, 1,000 prompt tokens at most


def charged(tokens: bytes, value: bytes | None = VALUE) -> int:
    return scheduled_as([("batchpipe-tokens", tokens)], value, CHARGING).tokens


def test_the_headers_a_publisher_writes_read_back() -> None:
    headers = [*pending_headers("batch-1", 2.5, "alice", deadline=1e9), tokens_header(300)]
    expected = Scheduled("batch-1", 2.5, "alice", 300, deadline=1e9)
    assert scheduled_as(headers, VALUE, CHARGING) == expected
    before = time.time()
    deadline = scheduled_as(pending_headers("b", 1.0)).deadline  # the completion window
    assert deadline is not None and before + COMPLETION_WINDOW_S <= deadline
    assert deadline <= time.time() + COMPLETION_WINDOW_S


@pytest.mark.parametrize(
    "raw", [b"nan", b"inf", b"-1", b"1e400", b"x", b"\xff", b"9" * 40, "\udcff"]
)
def test_a_bad_deadline_is_no_deadline(raw: bytes | str) -> None:
    headers = [*pending_headers("b", 1.0), (DEADLINE_HEADER, raw)]  # the last one wins
    assert scheduled_as(headers).deadline is None
    assert scheduled_as([(DEADLINE_HEADER, b"5")]).deadline is None  # no batch: no deadline


@pytest.mark.parametrize(
    ("raw", "weight"),
    [
        (b"1e-308", MIN_WEIGHT),
        (b"5e-324", MIN_WEIGHT),
        (b"1e-305", MIN_WEIGHT),
        (b"0", MIN_WEIGHT),
        (b"-3", MIN_WEIGHT),
        (b"1e400", MAX_WEIGHT),
        (b"inf", MAX_WEIGHT),
        (b"nan", 1.0),
        (b"heavy", 1.0),
        (b"9" * 5000, 1.0),  # longer than any number: not one
        (b"\xff\xfe", 1.0),
    ],
)
def test_a_weight_is_clamped_to_the_fair_shares_bounds(raw: bytes, weight: float) -> None:
    assert scheduled_as([(WEIGHT_HEADER, raw)], VALUE, CHARGING).weight == weight


def test_a_tokens_value_is_bounded_by_what_the_record_allows() -> None:
    floor, estimate, ceiling = CHARGING.bounds(VALUE)
    assert (floor, estimate, ceiling) == (250, 1256, 4000 + 8192)
    assert charged(b"300") == 300
    assert charged(b"1") == floor  # tokens=1: at least a quarter of the prompt's estimate
    assert charged(b"9" * 4301) == estimate  # not a bounded number: the feeder's estimate
    assert charged(str(10**400).encode()) == estimate
    assert charged(b"99999999999") == ceiling
    assert charged(b"\xd9\xa3") == estimate  # an Arabic-Indic 3: a digit, but not ASCII
    assert charged(b"-4") == estimate
    assert charged(b"99999", None) == 8192  # no value: max_tokens alone, within a batch


def test_a_compressed_record_is_bounded_by_the_size_its_frame_declares() -> None:
    frame = zstandard.ZstdCompressor().compress(b"a" * 400_000)  # declares its size
    assert len(frame) < 100
    assert CHARGING.content_bytes(frame) == 400_000
    assert charged(b"1", frame) == 100_000 // 4
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"a" * 10)
    assert CHARGING.content_bytes(unsized) == 1 << 20  # the worst it may decode to
    assert CHARGING.content_bytes(b"\x28\xb5\x2f\xfd" + b"junk") == 8


def test_a_direct_publisher_is_charged_the_feeders_own_estimate() -> None:
    """No headers at all (a producer outside batchpipe): its own kind of batch, charged
    the record's prompt estimate plus the default max_tokens."""
    assert scheduled_as(None, VALUE, CHARGING) == Scheduled("", 1.0, "", 1000 + 256)


def test_an_overlong_batch_id_or_key_makes_the_record_headerless() -> None:
    long = [("batchpipe-batch-id", b"b" * (MAX_ID_CHARS + 1)), ("batchpipe-key", b"k")]
    assert scheduled_as(long, VALUE, CHARGING).batch_id == ""
    surrogate = {"batchpipe-batch-id": "a\udc80b"}  # a str header that UTF-8 cannot hold
    assert scheduled_as(surrogate, VALUE, CHARGING).batch_id == "a?b"


@pytest.mark.parametrize("weight", [1e-308, 5e-324, 1e-305, 0.0, 1000.5, math.nan, math.inf])
def test_a_publisher_refuses_a_weight_out_of_bounds(weight: float) -> None:
    with pytest.raises(ValueError, match=r"at least 0\.001 and at most 1000"):
        check_weight(weight)


headers = st.lists(
    st.tuples(
        st.sampled_from(
            ["batchpipe-batch-id", "batchpipe-key", WEIGHT_HEADER, TOKENS_HEADER, "other"]
        ),
        st.one_of(st.none(), st.binary(max_size=64), st.text(max_size=64)),
    ),
    max_size=8,
)


@given(headers, st.one_of(st.none(), st.binary(max_size=256)))
def test_any_headers_and_value_read_as_a_bounded_schedule(
    pairs: list[tuple[str, bytes | str | None]], value: bytes | None
) -> None:
    to = scheduled_as(pairs, value, CHARGING)
    assert MIN_WEIGHT <= to.weight <= MAX_WEIGHT
    assert 1 <= to.tokens <= MAX_TOKENS
    assert len(to.batch_id) <= MAX_ID_CHARS and len(to.key) <= MAX_ID_CHARS
    to.batch_id.encode()  # a state key: always UTF-8
