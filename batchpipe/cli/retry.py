"""``batchpipe retry``: ask ``batchpipe serve`` for a new batch of an ended batch's lines
that failed in the engine."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import quote

import httpx

from batchpipe.cli.config import load
from batchpipe.cli.options import FORMATTER, Commands
from batchpipe.cli.outcome import EXIT_FAILED, EXIT_OK, report


def add_retry(commands: Commands, common: argparse.ArgumentParser) -> None:
    retry = commands.add_parser(
        "retry",
        parents=[common],
        help="a new batch of an ended batch's lines that failed in the engine (batchpipe serve)",
        description="Ask batchpipe serve for a new batch of the lines of BATCH_ID whose "
        "error was the engine's (5xxx), linked to it by metadata.batchpipe_retry_of; "
        "print the new batch's id (a batch retried before: the retry batch it already "
        "has, and 'already retried as' it on stderr), and list on stderr every other "
        "error line with why it "
        "is not retried (bad input, a cancelled or expired batch). Exit 1 when no line "
        "is worth retrying, or when the server refuses (an unknown batch, one not ended "
        "yet, its input or error file gone: the reason is printed) or cannot be reached. "
        "The key: --api-key, else OPENAI_API_KEY (as the SDK reads it).",
        formatter_class=FORMATTER,
    )
    retry.add_argument("batch_id", metavar="BATCH_ID", help="an ended batch of the API")
    retry.add_argument(
        "--url",
        help="the server's base URL, with or without /v1 as the SDK's base_url "
        "(default: http://api.host:api.port of the config)",
    )
    retry.add_argument("--api-key", metavar="KEY", help="the batch owner's API key")
    retry.set_defaults(func=_retry)


def _retry_answer(url: str, batch_id: str, key: str | None) -> dict[str, Any] | None:
    """The server's answer to a retry of ``batch_id``; None (reported) when there is no
    usable one: the server unreachable, a refusal, or an answer that is not a retry's."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    target = f"{url}/v1/batches/{quote(batch_id, safe='')}/retry"
    try:
        answer = httpx.post(target, headers=headers, timeout=60)
    except httpx.HTTPError as exc:
        report(f"cannot reach batchpipe serve at {url}: {str(exc) or type(exc).__name__}")
        return None
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    if answer.status_code != 200:
        error = doc.get("error") if isinstance(doc, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        hint = ""
        if answer.status_code == 401:
            hint = (
                " (no key was sent: pass --api-key KEY or set OPENAI_API_KEY)"
                if not key
                else " (the key given by --api-key or OPENAI_API_KEY was refused)"
            )
        report(f"{answer.status_code}: {message or answer.reason_phrase or 'refused'}{hint}")
        return None
    if not isinstance(doc, dict) or doc.get("object") != "batchpipe.retry":
        report(f"{url} answered 200 with something other than a retry: is it batchpipe serve?")
        return None
    return doc


def _retry(args: argparse.Namespace) -> int:
    api = load(args).api
    host = f"[{api.host}]" if ":" in api.host else api.host
    url = (args.url or f"http://{host}:{api.port}").rstrip("/").removesuffix("/v1")
    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    doc = _retry_answer(url, args.batch_id, key)
    if doc is None:
        return EXIT_FAILED
    for line in doc["not_retried"]:
        print(
            f"not retried: {line['custom_id']} ({line['code']}): {line['reason']}", file=sys.stderr
        )
    if doc["batch"] is None:
        report(f"no line of {args.batch_id} failed in the engine; nothing to retry")
        return EXIT_FAILED
    print(doc["batch"]["id"])
    if doc.get("already_retried"):
        print(f"{args.batch_id} already retried as {doc['batch']['id']}", file=sys.stderr)
    else:
        print(f"{doc['retried']} lines of {args.batch_id} retried", file=sys.stderr)
    return EXIT_OK
