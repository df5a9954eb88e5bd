"""The enqueued-token limit per key (``api.max_enqueued_tokens``), as OpenAI caps the
tokens a key may have enqueued per model.

A request's tokens are *estimated*, cheaply and without a tokenizer, as fair share
charges them (:func:`worker.feeder.estimate.request_tokens`). A batch's estimate
is recorded on it at create (``BatchRecord.tokens``), and what a key has enqueued is, over
its batches that have not ended, each one's estimate × the share of its requests not
answered yet. A batch that would take the key over its limit ends ``failed`` with
``token_limit_exceeded`` at create and nothing of it is published.

Two creates of one key at the same moment on two replicas may both pass: the limit is
checked against what this replica's state topic shows, not under a fleet-wide lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path

from batchpipe.api.records import BatchRecord, Counts
from batchpipe.batchfile import FileLimits, iter_file
from worker.config import Config
from worker.feeder.estimate import request_tokens

ANY_KEY = "*"
LIMIT_CODE = "token_limit_exceeded"


def token_limit(config: Config, owner: str) -> int | None:
    """The key's limit: its own entry, else ``"*"``'s, else none."""
    limits = config.api.max_enqueued_tokens
    found = limits.get(owner, limits.get(ANY_KEY))
    return None if found is None else int(found)


def file_tokens(path: Path, limits: FileLimits, default_max_tokens: int) -> int:
    return sum(request_tokens(req, default_max_tokens) for req in iter_file(path, limits))


def enqueued(
    batches: Iterable[BatchRecord], owner: str, counts: Callable[[BatchRecord], Counts]
) -> int:
    """Tokens of ``owner``'s unanswered requests in its batches that have not ended;
    ``counts`` gives a batch's live counts."""
    total = 0
    for batch in batches:
        if batch.owner != owner or batch.terminal or batch.counts.total == 0:
            continue
        now = counts(batch)
        left = max(0, now.total - now.completed - now.failed)
        total += math.ceil(batch.tokens * left / now.total) if now.total else 0
    return total


def over_limit(limit: int, queued: int, new: int) -> dict[str, object]:
    """The ``errors.data`` entry of a batch refused by the limit."""
    return {
        "code": LIMIT_CODE,
        "message": f"this batch's estimated {new} tokens and the {queued} already enqueued "
        f"by this key exceed its enqueued-token limit api.max_enqueued_tokens ({limit}); "
        "retry once earlier batches have progressed",
        "param": None,
        "line": None,
    }
