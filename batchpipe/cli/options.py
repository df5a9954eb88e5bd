"""The argument types and option groups several ``batchpipe`` commands share."""

from __future__ import annotations

import argparse
import re
from typing import TypeAlias

from worker.routing import RoutesError, parse_route

#: the subcommands' action of the top-level parser: each command module adds its own to it
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

FORMATTER = argparse.RawDescriptionHelpFormatter

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

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


def config_options() -> argparse.ArgumentParser:
    """The configuration options every command but ``broker`` takes (a parent parser)."""
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


def route_option(parser: argparse.ArgumentParser, use: str) -> None:
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


def since_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="UNIX_SECONDS",
        type=float,
        help="read the results topic from this submit time (default: the time inside a "
        "generated batch id batch_<unix_ms>_<hex>; for an id of your own, the beginning "
        "of the topic)",
    )
