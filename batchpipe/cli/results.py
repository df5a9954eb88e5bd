"""The commands that read batches' answers from Kafka: ``collect``, ``status`` and
``list``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from batchpipe.cli.config import connected_client
from batchpipe.cli.options import (
    FORMATTER,
    Commands,
    duration,
    positive_int,
    route_option,
    since_option,
)
from batchpipe.cli.outcome import EXIT_OK
from batchpipe.cli.spend import serve_records, spend_of, spend_text
from batchpipe.client import DEFAULT_COMPLETION_WINDOW_S, BatchStatus, Client
from batchpipe.progress import make_progress
from worker.config import ConfigError


def add_collect(commands: Commands, common: argparse.ArgumentParser) -> None:
    collect = commands.add_parser(
        "collect",
        parents=[common],
        help="write a batch's results as JSONL until it is complete (--partial: so far)",
        description="Read the results topic from the batch's submit time and write one "
        "line per custom_id, in the OpenAI batch output shape: completions to -o, "
        "failures to --errors. It follows the batch: each line is written as it lands "
        "(-o - streams them to stdout), and it ends when every request is answered. "
        "--partial writes only what is answered now and exits 0, however far the batch "
        "is: look at the first answers of a running batch (run it again for more). "
        "Progress goes to stderr: a bar on a terminal, a line every 10 s otherwise.",
        formatter_class=FORMATTER,
    )
    collect.add_argument("batch_id", metavar="ID", nargs="?", help="the batch to collect")
    collect.add_argument(
        "--batch-id", dest="batch_id_option", metavar="ID", help="the same as ID (older spelling)"
    )
    output_options(collect)
    collect.add_argument(
        "--partial",
        action="store_true",
        help="write the lines answered so far and exit 0, without waiting for the end",
    )
    collect.add_argument(
        "--topic", metavar="T", help="results topic (default: kafka.results_topic)"
    )
    since_option(collect)
    collect.set_defaults(func=_collect)


def add_status(commands: Commands, common: argparse.ArgumentParser) -> None:
    status = commands.add_parser(
        "status",
        parents=[common],
        help="request counts, state, tokens and cost of a batch",
        description="Read the batch's results to the end of the results topic and print "
        "its request counts (total, completed, failed), state (in_progress, completed, "
        "expired once the completion window has passed since submission) and tokens.",
        formatter_class=FORMATTER,
    )
    status.add_argument("batch_id", metavar="ID", help="the batch")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--price-per-1k",
        metavar="X",
        type=float,
        help="price per 1000 prompt + completion tokens, to estimate the cost (default: none)",
    )
    status.add_argument(
        "--completion-window",
        metavar="DURATION",
        type=duration,
        default=DEFAULT_COMPLETION_WINDOW_S,
        help="a batch not complete this long after submission is expired (default: 24h)",
    )
    status.add_argument("--topic", metavar="T", help="results topic (default: kafka.results_topic)")
    route_option(status, "routes tell status which requests topics to look in")
    since_option(status)
    status.set_defaults(func=_status)


def add_list(commands: Commands, common: argparse.ArgumentParser) -> None:
    listing = commands.add_parser(
        "list",
        parents=[common],
        help="the fleet's batches, newest first",
        description="Every batch with a request or an answer on the topics in the "
        "--last DURATION (default 24h, the completion window), newest first: id, state "
        "(in_progress, completed, expired), answered of total, completed and failed, "
        "submit time. Read from Kafka: batches of submit, run, the Python client and "
        "serve alike.",
        formatter_class=FORMATTER,
    )
    listing.add_argument(
        "--last",
        metavar="DURATION",
        type=duration,
        default=DEFAULT_COMPLETION_WINDOW_S,
        help="how far back to look (90s, 15m, 24h, 7d; default: 24h)",
    )
    listing.add_argument(
        "--limit",
        type=positive_int,
        default=20,
        metavar="N",
        help="show at most N, at least 1 (default: 20; --json says has_more when there are more)",
    )
    listing.add_argument("--json", action="store_true", help="one JSON object, as the SDK's")
    route_option(listing, "routes tell list which requests topics to read")
    listing.set_defaults(func=_list)


def output_options(parser: argparse.ArgumentParser) -> None:
    """Where ``collect`` and ``run`` write a batch's answers."""
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="results file, '-' for stdout (default: <batch id>.output.jsonl)",
    )
    parser.add_argument(
        "--errors", metavar="FILE", help="error lines file (default: <batch id>.errors.jsonl)"
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        type=duration,
        help="give up after this long (90, 90s, 15m, 2h), exit 124; the files keep what "
        "arrived (default: wait until complete)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def write_answers(
    args: argparse.Namespace,
    client: Client,
    batch_id: str,
    since: float | None,
    *,
    partial: bool = False,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    model: str | None = None,
) -> BatchStatus:
    """Write ``batch_id``'s answers as ``-o``/``--errors`` say until it is complete
    (``partial``: those answered now), under a cap where one is given
    (:meth:`~batchpipe.client.Client.collect`); its status."""
    output: str | TextIO = args.output or f"{batch_id}.output.jsonl"
    errors: str = args.errors or f"{batch_id}.errors.jsonl"
    if output == "-":
        output = sys.stdout
    progress = make_progress(sys.stderr, batch_id, quiet=args.quiet)

    def waiting(message: str) -> None:
        if not args.quiet:
            print(f"batchpipe: {message}", file=sys.stderr, flush=True)

    status = client.collect(
        batch_id,
        output,
        errors,
        args.timeout,
        since=since,
        progress=progress,
        on_wait=waiting,
        partial=partial,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
        model=model,
    )
    if not args.quiet:
        where = "stdout" if output is sys.stdout else output
        so_far = ""
        if partial:
            total = status.total or "?"
            so_far = f" ({status.completed + status.failed} of {total} answered so far)"
        print(
            f"{batch_id}: {status.completed} completed → {where}, "
            f"{status.failed} failed → {errors}{so_far}",
            file=sys.stderr,
        )
    return status


def format_status(status: BatchStatus, price_per_1k: float | None) -> str:
    """The human-readable form of ``batchpipe status``."""
    lines = [
        f"{status.batch_id}  {status.state}",
        f"  requests  total {status.total}  completed {status.completed}  failed {status.failed}",
        f"  tokens    prompt {status.prompt_tokens}  completion {status.completion_tokens}  "
        f"reasoning {status.reasoning_tokens}",
    ]
    if status.cost is not None:
        lines.append(f"  cost      {status.cost:.4f} (at {price_per_1k:g} per 1k tokens)")
    if status.tier is not None:
        lines.append(f"  tier      {status.tier}")
    if status.detail is not None:
        lines.append(f"  note      {status.detail}")
    return "\n".join(lines)


def _batch_id(args: argparse.Namespace) -> str:
    """The batch id, positional as for status and retry, or as --batch-id."""
    given: set[str] = {i for i in (args.batch_id, args.batch_id_option) if i is not None}
    if len(given) != 1:
        why = "is required" if not given else f"given twice, differently ({', '.join(given)})"
        raise ConfigError(f"the batch id {why}: batchpipe {args.command} ID")
    return given.pop()


def _collect(args: argparse.Namespace) -> int:
    batch_id = _batch_id(args)  # a usage error before the broker is asked
    write_answers(args, connected_client(args), batch_id, args.since, partial=args.partial)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    client = connected_client(args)
    status = client.status(
        args.batch_id,
        since=args.since,
        completion_window_s=args.completion_window,
        price_per_1k=args.price_per_1k,
    )
    records = serve_records(client.config.kafka, [status.batch_id])
    spend = spend_of(status, records.get(status.batch_id))
    if args.json:
        doc = status.to_dict()
        print(json.dumps(doc if spend is None else _with_spend(doc, spend)))
    else:
        text = format_status(status, args.price_per_1k)
        print(text if spend is None else f"{text}\n  spend     {spend_text(spend)}")
    return EXIT_OK


def _with_spend(doc: dict[str, Any], spend: Mapping[str, Any]) -> dict[str, Any]:
    """A batch object with its spend beside what ``batchpipe`` already holds (its tier)."""
    return {**doc, "batchpipe": {**doc.get("batchpipe", {}), "spend": spend}}


def _list(args: argparse.Namespace) -> int:
    from batchpipe.listing import format_listing, list_batches

    client = connected_client(args)
    found = list_batches(client, time.time() - args.last, DEFAULT_COMPLETION_WINDOW_S)
    shown = found[: args.limit]
    records = serve_records(client.config.kafka, [b.batch_id for b in shown]) if shown else {}
    spends = [spend_of(b, records.get(b.batch_id)) for b in shown]
    if args.json:
        data = [
            b.to_dict() if spend is None else _with_spend(b.to_dict(), spend)
            for b, spend in zip(shown, spends, strict=True)
        ]
        doc = {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(found) > len(shown),
        }
        print(json.dumps(doc))
    elif shown:
        lines = format_listing(shown).splitlines()
        print(
            "\n".join(
                line if spend is None else f"{line}  spend {spend_text(spend)}"
                for line, spend in zip(lines, spends, strict=True)
            )
        )
    else:
        print(f"no batch in the last {args.last:g} s (--last widens it)", file=sys.stderr)
    return EXIT_OK
