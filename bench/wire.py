"""Wire format: protobuf + zstd against JSON for realistic request and result messages.

Realistic means what the benchmarks send everywhere: a news brief of 3–7 sentences to
summarise in one sentence, with a system prompt, metadata and fixed ``max_tokens``; the
result carries a one-sentence summary, usage, timings and metadata. For each format it
reports the value's bytes on the wire, its header bytes, and encode / decode µs per
message (best of several passes over 1,000 distinct messages). Requests decode through
the worker's own path (:func:`worker.wire.codec.decode_request`: size check, decompression,
parsing, validation); JSON results decode with ``json.loads``, as a client would.

The share of the worker's time these costs take is measured in the running worker by
:mod:`bench.overhead` (stage counters); it is copied here when ``overhead.json`` exists.

This module also holds what the other benchmarks share about messages: the realistic
requests and a reader that stamps each result with its arrival time.

    .venv/bin/python -m bench.wire
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from msgspec import structs

from bench.common import RESULTS, write_result
from worker.config import Config, LimitsConfig
from worker.kafka import clients
from worker.wire.answers import format_output_line
from worker.wire.batchline import request_to_line
from worker.wire.codec import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    CodecLimits,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from worker.wire.compression import compress, inflate
from worker.wire.messages import (
    ChatMessage,
    InferenceRequest,
    InferenceResult,
    SamplingParams,
    Timings,
    Usage,
)

SYSTEM = "You summarise news briefs in one sentence, plainly and without speculation."
_SUBJECTS = (
    "The city council", "A local bakery", "Researchers at the university", "The regional airline",
    "A group of volunteers", "The water utility", "Farmers in the valley", "The public library",
    "A software startup", "The national weather service", "The hospital board", "Two schools",
)  # fmt: skip
_VERBS = (
    "announced", "reported", "opened", "postponed", "completed", "launched", "reviewed",
    "expanded", "criticised", "approved", "paused", "funded",
)  # fmt: skip
_OBJECTS = (
    "a new recycling programme", "plans for a second bridge", "record visitor numbers",
    "a study on river pollution", "a night bus service", "repairs to the old harbour wall",
    "a scheme to plant ten thousand trees", "free coding classes for adults",
    "a review of parking charges", "an early warning system for floods",
)  # fmt: skip
_TAILS = (
    "after months of debate.", "despite rising costs.", "ahead of the winter season.",
    "following complaints from residents.", "with support from local businesses.",
    "in a statement on Monday.", "as part of a five-year plan.", "to mixed reactions.",
)  # fmt: skip


def brief(rng: random.Random) -> str:
    """A short news text of 3–7 sentences, about 300–700 characters."""
    sentences = [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
        for _ in range(rng.randint(3, 7))
    ]
    cost, months = rng.randint(2, 90), rng.randint(3, 36)
    sentences.insert(1, f"Officials said it will cost {cost} million and take {months} months.")
    return " ".join(sentences)


def summary_requests(
    n: int, max_tokens: int, seed: int = 11, batch_id: str = "bench"
) -> list[InferenceRequest]:
    """``n`` distinct summarisation requests (distinct, so deduplication never applies)."""
    rng = random.Random(seed)
    return [
        InferenceRequest(
            custom_id=f"doc-{i:05d}",
            batch_id=batch_id,
            batch_total=n,
            messages=(
                ChatMessage("system", SYSTEM),
                ChatMessage("user", f"Summarise this brief (#{i}):\n\n{brief(rng)}"),
            ),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            metadata={"source": "bench", "desk": rng.choice(("city", "science", "weather"))},
        )
        for i in range(n)
    ]


def summary_result(request: InferenceRequest, rng: random.Random) -> InferenceResult:
    """A plausible completed answer to ``request``: one sentence, real-looking usage."""
    summary = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
    return InferenceResult(
        custom_id=request.custom_id,
        batch_id=request.batch_id,
        batch_total=request.batch_total,
        metadata=request.metadata,
        text=summary,
        usage=Usage(prompt_tokens=rng.randint(90, 190), completion_tokens=rng.randint(12, 40)),
        timings=Timings(queued_s=0.41, batch_wait_s=0.037, engine_s=1.92),
        batch_size=32,
        model="smollm2-135m-instruct",
        worker_id="worker-0",
        created_at=time.time(),
    )


def json_request(request: InferenceRequest) -> tuple[bytes, list[tuple[str, bytes]]]:
    """``request`` as one OpenAI/Bailian batch line, the way any Kafka client can send it."""
    line = json.dumps(request_to_line(request), separators=(",", ":")).encode()
    return line, [(CONTENT_TYPE, JSON_CONTENT_TYPE.encode())]


def prompt_fetch(config: Config) -> Config:
    """``config`` with consumers that see a new record within ~20 ms on the embedded broker.

    Tansu holds a fetch request for the full ``fetch.wait.max.ms`` (500 ms by default) even
    when records arrive meanwhile, where Apache Kafka answers at once; latency figures on it
    would mostly measure that wait. Applies to the worker's consumer and to the reader.
    """
    client = {**config.kafka.client, "fetch.wait.max.ms": 20}
    return replace(config, kafka=replace(config.kafka, client=client))


class ResultReader:
    """Reads a results topic as it fills, keeping each result with its arrival (unix) time."""

    def __init__(self, config: Config) -> None:
        k = config.kafka
        # created first: a consumer subscribed to a missing topic may not notice it appear
        # until its next metadata refresh, minutes later
        clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
        self._consumer = clients.consumer(k, group_id=f"bench-reader-{uuid.uuid4()}")
        self._consumer.subscribe([k.results_topic])
        self.arrived: dict[str, tuple[float, InferenceResult]] = {}

    def wait_for(self, ids: Collection[str], timeout_s: float) -> None:
        """Read until every id in ``ids`` has a result; RuntimeError after ``timeout_s``."""
        pending = set(ids) - self.arrived.keys()
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for m in self._consumer.consume(num_messages=1000, timeout=0.05):
                headers = m.headers()  # a list on consumed records
                if m.error() is None and not isinstance(headers, dict):
                    result = decode_result(m.value(), headers)
                    self.arrived.setdefault(result.custom_id, (time.time(), result))
                    pending.discard(result.custom_id)
        if pending:
            raise RuntimeError(f"{len(pending)} of {len(ids)} results missing after {timeout_s}s")

    def close(self) -> None:
        self._consumer.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of a non-empty sequence."""
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked) - 1, round(q / 100 * len(ranked) + 0.5) - 1))]


def _us_per_item(fn: Callable[[Any], object], items: Sequence[Any]) -> float:
    """CPU µs of this thread per item: other processes on the machine do not inflate it."""
    start = time.thread_time()
    for item in items:
        fn(item)
    return (time.thread_time() - start) / len(items) * 1e6


def _sizes(records: Sequence[tuple[bytes, Sequence[tuple[str, bytes]]]]) -> dict[str, float]:
    values = sum(len(v) for v, _ in records) / len(records)
    headers = sum(len(k) + len(h) for _, hs in records for k, h in hs) / len(records)
    return {"value_bytes": round(values, 1), "header_bytes": round(headers, 1)}


Record = tuple[bytes, list[tuple[str, bytes]]]
Codec = tuple[str, Callable[[Any], Record], Callable[[Record], object]]


def _rows(
    codecs: Sequence[Codec], messages: Sequence[Any], passes: int = 9
) -> list[dict[str, Any]]:
    """Sizes and the best encode/decode µs of each codec; passes interleave the codecs."""
    records = [[encode(m) for m in messages] for _, encode, _ in codecs]
    best = [[float("inf"), float("inf")] for _ in codecs]
    for _ in range(passes):
        for (_, encode, decode), encoded, times in zip(codecs, records, best, strict=True):
            times[0] = min(times[0], _us_per_item(encode, messages))
            times[1] = min(times[1], _us_per_item(decode, encoded))
    return [
        {
            "format": name,
            **_sizes(encoded),
            "encode_us": round(times[0], 2),
            "decode_us": round(times[1], 2),
        }
        for (name, _, _), encoded, times in zip(codecs, records, best, strict=True)
    ]


def _zstd(record: Record) -> Record:
    value, headers = record
    return compress(value), [*headers, (CONTENT_ENCODING, b"zstd")]


def _json_result(result: InferenceResult) -> Record:
    line = json.dumps(format_output_line(result), separators=(",", ":")).encode()
    return line, [(CONTENT_TYPE, JSON_CONTENT_TYPE.encode())]


def main(count: int = 1000) -> dict[str, Any]:
    limits = CodecLimits.from_config(LimitsConfig())
    requests = summary_requests(count, max_tokens=64)
    rng = random.Random(5)
    results = [summary_result(r, rng) for r in requests]

    def decode_req(record: Record) -> object:
        return decode_request(*record, limits)

    request_rows = _rows(
        [
            ("protobuf+zstd", encode_request, decode_req),
            ("json", json_request, decode_req),
            ("json+zstd", lambda q: _zstd(json_request(q)), decode_req),
        ],
        requests,
    )
    cap = limits.max_decompressed_bytes
    result_rows = _rows(
        [
            ("protobuf+zstd", encode_result, lambda r: decode_result(*r)),
            ("json", _json_result, lambda r: json.loads(r[0])),
            (
                "json+zstd",
                lambda q: _zstd(_json_result(q)),
                lambda r: json.loads(inflate(r[0], cap)),
            ),
        ],
        results,
    )
    figures: dict[str, Any] = {
        "messages": count,
        "request": "system prompt + a 3-7 sentence brief to summarise, max_tokens 64, metadata",
        "result": "one-sentence summary, usage, timings, metadata (OpenAI batch output line)",
        "timing": "CPU µs per message (thread time), best of 9 interleaved passes",
        "requests": request_rows,
        "results": result_rows,
    }
    overhead = RESULTS / "overhead.json"
    if overhead.exists():
        variants = json.loads(overhead.read_text())["variants"]
        figures["worker_share"] = {
            v["name"]: v["stage_share_of_loop"] for v in variants if "stage_share_of_loop" in v
        }
    path = write_result("wire", figures)
    print(path, json.dumps(figures, indent=1))
    return figures


def timestamped(request: InferenceRequest) -> InferenceRequest:
    """``request`` stamped as submitted now (end-to-end latency starts here)."""
    return structs.replace(request, submitted_at=time.time())


if __name__ == "__main__":
    main()
