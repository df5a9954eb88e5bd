"""Chaos: poison pills from a second producer, between two runs of good requests.

Each pill is a record a careless or hostile producer can write. The wire contract says
what answers it (docs/architecture.md, error codes): a result under its ``custom_id``
(completed, or an error with its code) when one can be read from the bytes, else a
dead letter carrying the original key, value and headers. Each pill must be answered
exactly once, the worker must stay up, and the requests after the pills must be served.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.integration.chaos_report import ChaosReport
from tests.integration.fleet import fleet
from tests.integration.harness import (
    Headers,
    ResultWatcher,
    publish,
    publish_keyed,
    write_config,
)
from tests.integration.scenario import TOKENS, conclude, merged, paced, requests
from worker.config import Config
from worker.errors import ErrorCode
from worker.wire.codec import encode_request
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams
from worker.wire.validation import escaped

pytestmark = pytest.mark.integration

PILLS = "pills"  # the batch id every pill that has one declares
JSON: Headers = [("content-type", b"application/json")]
TEXT: Headers = [("content-type", b"text/plain")]
PROTOBUF: Headers = encode_request(
    InferenceRequest(custom_id="x", messages=(ChatMessage("user", "x"),))
)[1]


@dataclass(frozen=True)
class Pill:
    """A record (keyed by ``name``) and the answer the wire contract gives it: a result
    for ``custom_id`` with ``code`` (None: completed), or a dead letter with ``code``."""

    name: str
    value: bytes | None
    headers: Headers
    custom_id: str | None  # None: dead-lettered, no custom_id can be read
    code: int | None


def line(custom_id: str, content: str = "a poison pill", **extra: Any) -> dict[str, Any]:
    """A batch input line of the pills' batch; ``extra`` goes into the body, except
    ``metadata``, which goes at the top level."""
    metadata = extra.pop("metadata", None)
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, **extra}
    obj: dict[str, Any] = {
        "custom_id": custom_id,
        "batch_id": PILLS,
        "batch_total": len(answered_pills()),
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
    }
    if metadata is not None:
        obj["metadata"] = metadata
    return obj


def dumps(obj: dict[str, Any]) -> bytes:
    # ensure_ascii writes a lone surrogate as the escape "\ud800": valid JSON
    return json.dumps(obj, ensure_ascii=True).encode()


def protobuf(custom_id: str, unknown_fields: bytes = b"") -> bytes:
    """A protobuf request of the pills' batch, zstd-framed, with raw extra fields."""
    request = InferenceRequest(
        custom_id=custom_id,
        batch_id=PILLS,
        batch_total=len(answered_pills()),
        messages=(ChatMessage("user", "a protobuf pill"),),
        sampling=SamplingParams(max_tokens=TOKENS),
    )
    frame = encode_request(request)[0]
    plain = zstandard.ZstdDecompressor().decompress(frame)
    return zstandard.ZstdCompressor().compress(plain + unknown_fields)


# field 1000 (varint 1) and field 1001 (bytes "hello"): numbers the contract does not use
UNKNOWN_FIELDS = b"\xc0\x3e\x01" + b"\xca\x3e\x05hello"
NESTING = 100_000


def answered_pills() -> list[str]:
    """The ``custom_id`` of each pill answered on the results topic."""
    return [
        "pill-\\ud800",
        "pill-surrogate-metadata",
        "pill-surrogate-content",
        "pill-huge-int",
        "pill-huge-float",
        "pill-json-without-content-type",
        "pill-protobuf-without-content-type",
        "pill-unknown-fields",
    ]


def pills() -> list[Pill]:
    malformed, invalid, over = (
        int(ErrorCode.MALFORMED),
        int(ErrorCode.INVALID_PARAMETER),
        int(ErrorCode.OVER_LIMIT),
    )
    deep = b"[" * NESTING + b"]" * NESTING
    digits = b"9" * 5000  # past Python's int-from-text limit (4,300 digits)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 * 1024 * 1024))
    return [
        Pill("surrogate-id", dumps(line("pill-\ud800")), JSON, escaped("pill-\ud800"), malformed),
        Pill(
            "surrogate-metadata",
            dumps(line("pill-surrogate-metadata", metadata={"tag": "\udc00"})),
            JSON,
            "pill-surrogate-metadata",
            malformed,
        ),
        Pill(
            "surrogate-content",
            dumps(line("pill-surrogate-content", content="bad \ud83d text")),
            JSON,
            "pill-surrogate-content",
            malformed,
        ),
        Pill(
            "deep-nesting",
            b'{"custom_id": "pill-deep", "metadata": {"x": ' + deep + b"}}",
            JSON,
            None,
            malformed,
        ),
        Pill(
            "huge-int",
            dumps(line("pill-huge-int", max_tokens=10**400)),
            JSON,
            "pill-huge-int",
            invalid,
        ),
        Pill(
            "huge-float",
            dumps(line("pill-huge-float")).replace(b'"max_tokens": 10', b'"temperature": 1e400'),
            JSON,
            "pill-huge-float",
            invalid,
        ),
        Pill(
            "int-past-python-limit",
            dumps(line("pill-int-past-limit")).replace(b'"max_tokens": 10', b'"seed": ' + digits),
            JSON,
            None,
            malformed,
        ),
        Pill("wrong-content-type", dumps(line("pill-wrong-type")), TEXT, None, malformed),
        Pill("protobuf-as-json", protobuf("pill-protobuf-as-json"), JSON, None, malformed),
        Pill(
            "json-without-content-type",
            dumps(line("pill-json-without-content-type")),
            None,
            "pill-json-without-content-type",
            None,
        ),
        Pill(
            "protobuf-without-content-type",
            protobuf("pill-protobuf-without-content-type"),
            None,
            "pill-protobuf-without-content-type",
            None,
        ),
        Pill("empty-value", b"", PROTOBUF, None, malformed),
        Pill("no-value", None, None, None, malformed),
        Pill("zstd-bomb", bomb, PROTOBUF, None, over),
        # refused, naming the field: serving without it would ignore what was asked
        Pill(
            "unknown-fields",
            protobuf("pill-unknown-fields", UNKNOWN_FIELDS),
            PROTOBUF,
            "pill-unknown-fields",
            invalid,
        ),
    ]


def test_chaos_poison_pills(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    config = paced(kafka_config, token_s=0.002)
    before = publish(config, requests(20, "before"), keyed=True)
    poison = pills()
    assert sorted(p.custom_id for p in poison if p.custom_id) == sorted(
        escaped(c) for c in answered_pills()
    )
    sent = publish_keyed(config, [(p.name.encode(), p.value, p.headers) for p in poison])
    after = publish(config, requests(20, "after", start=20), keyed=True)
    watcher = ResultWatcher(config)
    dead = [p for p in poison if p.custom_id is None]
    batches = {
        "before": [r.custom_id for r in requests(20, "before")],
        PILLS: [escaped(c) for c in answered_pills()],
        "after": [r.custom_id for r in requests(20, "after", start=20)],
    }
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            workers.start()
            watcher.wait_until(
                lambda: (
                    watcher.ids >= {i for ids in batches.values() for i in ids}
                    and len(watcher.dead_keys) >= len(dead)
                ),
                timeout_s=120,
                what="every request and pill answered",
                check=workers.assert_alive,
            )
            answers = {p.name: answer_of(watcher, p) for p in poison}
            assert answers == {p.name: (1, p.code) for p in poison}
            conclude(
                "poison pills from a second producer",
                config,
                merged(before.ends, sent.ends, after.ends),
                batches,
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=120,
                dead_letters=len(dead),
            )
    finally:
        watcher.close()


def _code(watcher: ResultWatcher, custom_id: str) -> int | None:
    error = watcher.first[custom_id].error
    return None if error is None else int(error.code)


def answer_of(watcher: ResultWatcher, pill: Pill) -> tuple[int, int | None]:
    """How many answers ``pill`` had, and the code of the first (None: completed)."""
    if pill.custom_id is None:
        key = pill.name.encode()
        return watcher.dead_keys[key], watcher.dead_codes.get(key)
    return watcher.per_id[pill.custom_id], _code(watcher, pill.custom_id)


def test_chaos_oversized_pills(
    kafka_config: Config, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    """Records near librdkafka's default ``message.max.bytes`` (1,000,000): a result that
    copies ~1 MB of metadata, a dead letter that adds headers to ~1 MB of bytes. Each is
    answered once (the result completed, or 4003 when over the producer's limit), never
    a crash loop."""
    config = paced(kafka_config, token_s=0.002)
    metadata = {"blob": "x" * 1_050_000}
    big = dict(line("pill-big-metadata", metadata=metadata), batch_id="big", batch_total=1)
    undecodable = b"\xff" * 999_950  # neither JSON, zstd nor protobuf
    sent = publish_keyed(
        config,
        [(b"big-metadata", dumps(big), JSON), (b"big-undecodable", undecodable, None)],
        max_message_bytes=4 * 1024 * 1024,
    )
    after = publish(config, requests(20, "after", start=20), keyed=True)
    watcher = ResultWatcher(config)
    try:
        with fleet(write_config(config, tmp_path / "worker.yaml")) as workers:
            workers.start()
            conclude(
                "oversized results and dead letters",
                config,
                merged(sent.ends, after.ends),
                {"big": ["pill-big-metadata"], "after": [f"r{i}" for i in range(20, 40)]},
                watcher,
                workers,
                chaos_report,
                tmp_path,
                answer_bound_s=120,
                dead_letters=1,
            )
    finally:
        watcher.close()
    assert watcher.per_id["pill-big-metadata"] == 1
    assert _code(watcher, "pill-big-metadata") in (None, int(ErrorCode.OVER_LIMIT))
    assert watcher.dead_keys == {b"big-undecodable": 1}
