"""The commands that validate and publish a batch file: ``submit``, and ``run`` (submit,
then collect)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from batcher.tiers import DEFAULT, TIERS, check_allowance
from batchpipe.batchfile import FileLimits, scan_file
from batchpipe.caps import MAX_CAP_TOKENS, MAX_CAP_USD, Cap, given_cap
from batchpipe.cli.config import load, reach
from batchpipe.cli.options import FORMATTER, Commands, route_option
from batchpipe.cli.outcome import EXIT_CAPPED, EXIT_OK, report
from batchpipe.cli.results import output_options, write_answers
from batchpipe.client import Client, SubmitReceipt, check_name
from batchpipe.fleet import ModelNotServedError, not_served, served_models
from batchpipe.reach import quiet_clients
from worker.config import ConfigError
from worker.feeder.naming import check_weight


def add_submit(commands: Commands, common: argparse.ArgumentParser) -> None:
    submit = commands.add_parser(
        "submit",
        parents=[common],
        help="validate a JSONL batch file and publish it; print the batch id",
        description="Validate every line of an OpenAI/Alibaba Bailian batch file, then "
        "publish all of them in one Kafka transaction (all or none) and print the batch "
        "id on stdout. A file with any invalid line publishes nothing; each bad line is "
        "named with its error code (4001 malformed or duplicate custom_id, 4002 invalid "
        "value or unknown url, 4003 over a limit).\n\n"
        "Routing: a fleet serves several models with one requests topic per model, each "
        "read by the consumer group of workers that loaded it; results share one results "
        "topic. The file's model (body.model; one per file, as OpenAI requires) picks its "
        "topic from --route MODEL=TOPIC or kafka.routes; without routes everything goes to "
        "kafka.requests_topic (--topic).",
        formatter_class=FORMATTER,
    )
    submit.add_argument("file", metavar="FILE.jsonl", type=Path, help="the batch file")
    submit.add_argument(
        "--topic",
        metavar="T",
        help="requests topic when no routes are set (default: kafka.requests_topic); "
        "refused together with routes",
    )
    _submit_options(submit)
    _cap_options(submit, follows=False)
    submit.set_defaults(func=_submit)


def add_run(commands: Commands, common: argparse.ArgumentParser) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="submit a batch file, follow it with progress, write its results: one command",
        description="batchpipe submit, then collect, in one command (as vllm run-batch -i "
        "FILE -o OUT): validate and publish FILE, follow it with a progress bar on stderr "
        "and write its completions to -o and its failures to --errors until every line is "
        "answered. The batch id goes to stdout first, so an interrupted run can be "
        "collected later (batchpipe collect ID). Needs running workers (batchpipe worker) "
        "or batchpipe demo's; exit codes as submit and collect.",
        formatter_class=FORMATTER,
    )
    run.add_argument("file", metavar="FILE.jsonl", type=Path, help="the batch file")
    output_options(run)
    _submit_options(run)
    _cap_options(run, follows=True)
    run.set_defaults(func=_run)


def _submit_options(submit: argparse.ArgumentParser) -> None:
    """What ``submit`` and ``run`` take to validate and publish a file."""
    submit.add_argument(
        "--batch-id",
        metavar="ID",
        help="batch id (default: a new batch_<unix_ms>_<hex>); submitting again with the "
        "same id does not double-count: results are kept once per custom_id",
    )
    route_option(submit, "nothing is published then")
    submit.add_argument(
        "--weight",
        type=float,
        metavar="W",
        help="with scheduling.fair: this batch's share of the fleet against the other "
        "active keys and its key's other batches, in [0.001, 1000] (default: "
        "scheduling.weight, 1); without it the batch joins the requests topic's FIFO and a "
        "weight is refused",
    )
    submit.add_argument(
        "--key",
        default="",
        metavar="NAME",
        help="with scheduling.fair: whose share this batch takes (a key's batches together "
        'get one key\'s share; default: the unnamed key ""); refused without it',
    )
    submit.add_argument(
        "--tier",
        choices=TIERS,
        default=DEFAULT,
        help="with scheduling.fair: the batch's service tier: priority (fed ahead of the "
        "default tier, within the key's allowance, scheduling.priority_shares; refused for "
        "a key whose allowance is 0), default, or "
        "flex (fed only from capacity no other batch wants, the first to give way)",
    )
    limits = FileLimits()
    submit.add_argument(
        "--max-lines",
        type=int,
        default=limits.max_lines,
        help=f"most requests in one file (default: {limits.max_lines})",
    )
    submit.add_argument(
        "--max-file-bytes",
        type=int,
        default=limits.max_file_bytes,
        help=f"largest file (default: {limits.max_file_bytes}, 500 MB)",
    )
    submit.add_argument(
        "--max-line-bytes",
        type=int,
        default=limits.max_line_bytes,
        help=f"largest line (default: {limits.max_line_bytes}, 6 MB)",
    )
    submit.add_argument(
        "--mixed-models",
        action="store_true",
        help="allow several models in one file, each line published to its own model's "
        "topic (default: one model per file; other lines are refused by line number)",
    )


_CAP_NAMES = ("--max-tokens", "--max-cost-usd")


def _cap_options(parser: argparse.ArgumentParser, *, follows: bool) -> None:
    """``run`` follows the batch and stops it at its cap; ``submit`` does not follow it,
    so it refuses a cap rather than take one nothing would enforce."""
    if follows:
        tokens = (
            f"stop the batch once its answers' prompt + completion tokens reach N (1 to "
            f"{MAX_CAP_TOKENS:.0e}): run announces its stop, the lines not run are answered "
            "4008 batch_cap_reached into --errors, and run exits 5 saying the spend"
        )
        cost = (
            f"the same in US dollars (above 0, at most {MAX_CAP_USD:,.0f}), priced at "
            "api.prices of the file's model (one model, with a price)"
        )
    else:
        tokens = cost = (
            "refused: submit does not follow the batch, so nothing would stop it; cap a "
            "batch with batchpipe run or batchpipe serve (batch metadata)"
        )
    parser.add_argument("--max-tokens", metavar="N", help=tokens)
    parser.add_argument("--max-cost-usd", metavar="X", help=cost)


def _publish(args: argparse.Namespace) -> tuple[Client, SubmitReceipt, Cap, str | None]:
    """Validate ``args.file`` (and ``run``'s cap) and publish it (``submit``, ``run``);
    with the cap and the file's model (None: several)."""
    limits = FileLimits(
        max_lines=args.max_lines,
        max_file_bytes=args.max_file_bytes,
        max_line_bytes=args.max_line_bytes,
        one_model=not args.mixed_models,
    )
    config = load(args)  # its errors before the broker's: nothing would be published
    if args.weight is not None:
        if not config.scheduling.fair:
            raise ConfigError("--weight: applies with scheduling.fair only (a FIFO has no shares)")
        try:
            check_weight(args.weight)
        except ValueError as exc:
            raise ConfigError(f"--weight: {exc}") from exc
    if args.tier != DEFAULT and not config.scheduling.fair:
        raise ConfigError("--tier: applies with scheduling.fair only (a FIFO has no tiers)")
    if args.key and not config.scheduling.fair:
        raise ConfigError("--key: applies with scheduling.fair only (a FIFO has no shares)")
    for flag, text in (("--batch-id", args.batch_id), ("--key", args.key)):
        try:
            check_name(text or "", flag)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    # a TierRefusedError (exit 2) before the file is read: the key's allowance is 0
    check_allowance(args.tier, config.scheduling.priority_shares, args.key, "--tier")
    # a bad file or a model without a route is refused before Kafka is asked
    scan = scan_file(args.file, limits)
    model = next(iter(scan.models)) if len(scan.models) == 1 else None
    cap = given_cap(args.max_tokens, args.max_cost_usd, model, config.api.prices, _CAP_NAMES)
    client = Client(quiet_clients(config, args.verbose), limits=limits)
    for model in scan.models:
        client.routing.topic_for(model)
    reach(args, client)
    refused = not_served(scan.models, served_models(client.config.kafka))
    if refused is not None:  # every line would fail in the workers
        raise ModelNotServedError(f"{args.file}: {refused}; nothing was published")
    receipt = client.publish_file(
        args.file,
        scan.total,
        args.batch_id,
        scan.models,
        weight=args.weight,
        key=args.key,
        tier=args.tier,
    )
    print(f"submitted {receipt.total} requests from {args.file}", file=sys.stderr)
    return client, receipt, cap, model


def _submit(args: argparse.Namespace) -> int:
    for flag, given in zip(_CAP_NAMES, (args.max_tokens, args.max_cost_usd), strict=True):
        if given is not None:
            raise ConfigError(
                f"{flag}: submit does not follow the batch, so nothing would stop it at a "
                "cap; use batchpipe run (it follows the batch and stops it at the cap) or "
                "batchpipe serve (metadata batchpipe_max_tokens); nothing was published"
            )
    _, receipt, _, _ = _publish(args)
    print(receipt.batch_id, flush=True)
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    client, receipt, cap, model = _publish(args)
    try:  # from here on the batch is published, whatever Ctrl-C interrupts
        print(receipt.batch_id, flush=True)
        status = write_answers(
            args,
            client,
            receipt.batch_id,
            receipt.submitted_at,
            max_tokens=cap.max_tokens,
            max_cost_usd=cap.max_cost_usd,
            model=model,
        )
        if status.capped is None:
            return EXIT_OK
        report(f"{receipt.batch_id} stopped at its cap: {status.capped}")
        return EXIT_CAPPED
    except KeyboardInterrupt:
        # Ctrl-C stops the following, not the batch: say so, lest it be submitted twice
        report(
            f"interrupted: batch {receipt.batch_id} was published and the workers still "
            f"answer it; follow it again with: batchpipe collect {receipt.batch_id}"
        )
        raise
