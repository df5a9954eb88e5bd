"""The ``batchpipe`` parser of every command, and :func:`main`: run the chosen command and
turn its failure into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import httpx
from confluent_kafka import KafkaException

from batchpipe.cli.options import FORMATTER, config_options
from batchpipe.cli.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, exit_code, report
from batchpipe.cli.processes import add_broker, add_demo, add_serve, add_worker
from batchpipe.cli.results import add_collect, add_list, add_status
from batchpipe.cli.retry import add_retry
from batchpipe.cli.submit import add_run, add_submit
from worker.errors import BatchpipeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchpipe",
        description="Kafka-driven streaming batch inference for LLMs: run the broker and "
        "workers, submit OpenAI/Bailian batch files, follow and collect them.",
        epilog="Exit codes: 0 ok, 1 Kafka failure or unknown batch, 2 bad command line, "
        "configuration or batch file, 3 model failed to load, 4 worker wedged (an engine "
        "call hung past engine.engine_timeout_s; restart it), 124 collect timed out, "
        "130 interrupted.",
        formatter_class=FORMATTER,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = config_options()
    # in the order `batchpipe --help` lists them
    add_broker(commands)
    add_worker(commands, common)
    add_submit(commands, common)
    add_collect(commands, common)
    add_status(commands, common)
    add_run(commands, common)
    add_list(commands, common)
    add_serve(commands, common)
    add_retry(commands, common)
    add_demo(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BatchpipeError as exc:
        report(str(exc), exc.code)
        return exit_code(exc)
    except OSError as exc:  # a file that cannot be read or written
        report(str(exc))
        return EXIT_USAGE
    except (KafkaException, httpx.HTTPError) as exc:
        report(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return code
