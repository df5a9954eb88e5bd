"""File and batch records: their state-topic encoding and their OpenAI shapes, read with
the official SDK's types, strictly."""

from __future__ import annotations

from typing import Any

from openai.types import Batch, FileDeleted, FileObject

from batchpipe.api.records import BatchRecord, Counts, FileRecord, Usage
from tests.openai_sdk import sdk_parse

FILE = FileRecord(
    id="file-1",
    owner="alice",
    filename="in.jsonl",
    size=120,
    created_at=1_700_000_000,
    purpose="batch",
    lines=3,
    endpoints=("chat",),
    model="echo",
)
BATCH = BatchRecord(
    id="batch_1700000000000_ab",
    owner="alice",
    input_file_id="file-1",
    endpoint="/v1/chat/completions",
    completion_window="24h",
    created_at=1_700_000_000,
    expires_at=1_700_086_400,
    metadata={"job": "x"},
    model="echo",
    counts=Counts(3, 0, 0),
)


def test_records_survive_the_state_topic() -> None:
    assert FileRecord.decode(FILE.encode()) == FILE
    ended = BatchRecord(
        **{
            **BATCH.__dict__,
            "status": "failed",
            "usage": Usage(5, 7, 1),
            "errors": ({"code": "4002", "message": "m", "param": "url", "line": 2},),
        }
    )
    assert BatchRecord.decode(ended.encode()) == ended


def test_file_object_is_the_sdk_shape() -> None:
    parsed = sdk_parse(FileObject, FILE.to_openai())
    assert (parsed.bytes, parsed.purpose) == (120, "batch")
    sdk_parse(FileDeleted, {"id": "file-1", "object": "file", "deleted": True})


def _sdk_batch(doc: dict[str, Any]) -> Batch:
    """The batch object as the SDK's ``Batch``, beside batchpipe's one extension: its
    ``batchpipe`` object (the SDK keeps it in ``model_extra``): spend and service tier."""
    assert set(doc["batchpipe"]) == {"spend", "tier"}
    assert doc["batchpipe"]["tier"] in ("priority", "default", "flex")
    return sdk_parse(Batch, {k: v for k, v in doc.items() if k != "batchpipe"})


def test_batch_object_is_the_sdk_shape_in_every_state() -> None:
    running = _sdk_batch(BATCH.to_openai(Counts(3, 1, 1), Usage(10, 4, 0)))
    assert running.request_counts is not None and running.request_counts.completed == 1
    assert running.usage is not None and running.usage.total_tokens == 14
    failed = BatchRecord(
        **{
            **BATCH.__dict__,
            "status": "failed",
            "failed_at": 1_700_000_001,
            "errors": ({"code": "4002", "message": "m", "param": "url", "line": 2},),
        }
    )
    parsed = _sdk_batch(failed.to_openai())
    assert parsed.errors is not None and parsed.errors.data is not None
    assert parsed.errors.data[0].line == 2
