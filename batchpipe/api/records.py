"""The API's file and batch records, and the OpenAI objects they become.

Records are what the state topic holds (:mod:`batchpipe.api.state`), one JSON value per
key. They carry their owner; the OpenAI objects (``file``, ``batch``) do not. Shapes
follow the official ``openai`` SDK's ``FileObject``, ``FileDeleted`` and ``Batch`` types.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, TypeVar

from batchpipe.api.costcap import Cap
from batchpipe.api.tiers import shown_tier
from worker.wire.messages import Endpoint

BatchState = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
Purpose = Literal["batch", "batch_output"]

#: the OpenAI endpoints batchpipe serves, and the request kind each one takes
ENDPOINTS: Mapping[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}

R = TypeVar("R", "FileRecord", "BatchRecord")


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def output_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output (``kind`` output) or error file (errors)."""
    return f"file-{batch_id}-{kind}"


def output_batch_id(file_id: str) -> str:
    """The batch whose output or error file ``file_id`` is (batch ids hold no ``-``)."""
    return file_id.removeprefix("file-").rsplit("-", 1)[0]


def _load(cls: type[R], value: bytes) -> R:
    doc = json.loads(value)
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class FileRecord:
    """An uploaded (``batch``) or produced (``batch_output``) file; immutable once made."""

    id: str
    owner: str
    filename: str
    size: int  # bytes
    created_at: int
    purpose: Purpose
    lines: int = 0
    # kinds of request in an input file ("chat", "completions") and its model
    endpoints: tuple[str, ...] = ()
    model: str = ""
    expires_at: int | None = None  # batchpipe.api.retention

    @property
    def key(self) -> str:
        return f"file:{self.id}"

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, value: bytes) -> FileRecord:
        record = _load(cls, value)
        return replace(record, endpoints=tuple(record.endpoints))

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }


@dataclass(frozen=True)
class Counts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def to_openai(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass(frozen=True)
class BatchRecord:
    """A batch and where it stands; ``version`` grows with every change of state."""

    id: str
    owner: str
    input_file_id: str
    endpoint: str
    completion_window: str
    created_at: int
    expires_at: int
    status: BatchState = "validating"
    metadata: Mapping[str, str] = field(default_factory=dict)
    model: str = ""
    # seconds its output and error files live after they are written (None: the default)
    output_expires_after: int | None = None
    # estimated tokens of its requests (prompt + max_tokens), recorded at create
    # (batchpipe.api.quota); 0 for a batch created before it was
    tokens: int = 0
    # its token and cost caps and its model's prices, resolved at create
    # (batchpipe.api.costcap); None for a batch created before caps existed
    cap: Cap | None = None
    version: int = 0
    counts: Counts = Counts()
    usage: Usage | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    # BatchError objects: {"code", "message", "param", "line"}
    errors: tuple[Mapping[str, Any], ...] = ()
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None

    @property
    def key(self) -> str:
        return f"batch:{self.id}"

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, value: bytes) -> BatchRecord:
        record = _load(cls, value)
        usage: Any = record.usage
        counts: Any = record.counts
        cap: Any = record.cap
        return replace(
            record,
            cap=None if cap is None else Cap.decode(cap),
            counts=Counts(**counts),
            usage=None if usage is None else Usage(**usage),
            errors=tuple(record.errors),
        )

    def to_openai(self, counts: Counts | None = None, usage: Usage | None = None) -> dict[str, Any]:
        """The OpenAI ``batch`` object; live ``counts``/``usage`` replace the recorded ones
        while the batch runs."""
        counts = counts or self.counts
        usage = usage or self.usage
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": [dict(e) for e in self.errors]}
            if self.errors
            else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": asdict(counts),
            "metadata": dict(self.metadata),
            "model": self.model or None,
            "usage": None if usage is None else usage.to_openai(),
            # batchpipe's own fields, as /v1/models carries them (the SDK keeps extra fields)
            # and the service tier it runs in (batchpipe/api/tiers.py)
            "batchpipe": {"spend": self.spend(usage), "tier": shown_tier(self.metadata)},
        }

    def spend(self, usage: Usage | None) -> dict[str, Any]:
        """What the batch spent against its caps (``batchpipe.spend``, docs/api.md)."""
        usage = usage or Usage()
        return (self.cap or Cap()).view(usage.input_tokens, usage.output_tokens)
