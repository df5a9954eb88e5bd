"""Is the broker there? One line within seconds, before a command talks to Kafka.

Without a broker, librdkafka retries its connection for the whole of its own timeouts
(30 s and more) and logs every refused attempt (hundreds of ``%3|…|FAIL|…`` lines) before
the first call fails with a raw ``KafkaError``. The commands that read or publish
(``submit``, ``status``, ``collect``, ``run``, ``list``) ask the cluster for its metadata
first, within :data:`REACH_TIMEOUT_S`, and report a silence as one line naming the
address, where it came from and what to do. librdkafka's own log goes to the
``batchpipe.kafka`` logger (:func:`kafka_log`): on stderr with ``-v``, else only its
errors, one line per :data:`QUIET_EVERY_S` at most, so a broker lost mid-``collect`` is
still reported, never silently waited on.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from worker.config import Config, ConfigError, KafkaConfig
from worker.envconfig import ENV_PREFIX
from worker.errors import BatchpipeError

#: how long the metadata request may take; a broker that answers does in milliseconds
REACH_TIMEOUT_S = 5.0
#: without -v, at most one librdkafka error line per this long
QUIET_EVERY_S = 30.0
BOOTSTRAP_VARIABLE = "BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS"


class BrokerUnreachableError(BatchpipeError):
    """No broker answered at the configured bootstrap address."""


def bootstrap_source(
    *,
    shortcut: str | None,
    sets: Sequence[str],
    environ: Mapping[str, str],
    config_file: str | None,
) -> str:
    """Where ``kafka.bootstrap_servers`` came from, the last source that set it winning."""
    if shortcut:
        return "--bootstrap"
    if any(item.partition("=")[0] == "kafka.bootstrap_servers" for item in sets):
        return "--set kafka.bootstrap_servers"
    if BOOTSTRAP_VARIABLE in environ:
        return f"environment {BOOTSTRAP_VARIABLE}"
    if config_file is not None and _file_sets_bootstrap(Path(config_file)):
        return f"kafka.bootstrap_servers in {config_file}"
    return "the built-in default of kafka.bootstrap_servers"


def _file_sets_bootstrap(path: Path) -> bool:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):  # load_config read it already: it is readable YAML
        return False
    kafka = doc.get("kafka") if isinstance(doc, dict) else None
    return isinstance(kafka, dict) and "bootstrap_servers" in kafka


def check_broker(
    kafka: KafkaConfig, source: str, *, verbose: bool = False, timeout_s: float = REACH_TIMEOUT_S
) -> None:
    """Raise :class:`BrokerUnreachableError` unless the cluster answers a metadata request
    within ``timeout_s``; librdkafka's log of the attempt on stderr with ``verbose``."""
    if verbose:
        logger = kafka_log(verbose=True)
    else:
        logger = logging.getLogger("batchpipe.kafka.reach")
        logger.propagate = False
        logger.handlers = [logging.NullHandler()]
    admin = _admin(kafka, logger, timeout_s)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        admin.poll(0)  # the attempt's log lines, queued for this thread (-v)
        raise BrokerUnreachableError(
            f"no Kafka broker answers at {kafka.bootstrap_servers} (from {source}) within "
            f"{timeout_s:g} s: start one with `batchpipe broker` and pass the address it "
            "prints with --set kafka.bootstrap_servers=ADDR (or --bootstrap ADDR, or "
            f"{BOOTSTRAP_VARIABLE}); -v shows librdkafka's log "
            f"[{exc.args[0].name() if exc.args else 'no answer'}]"
        ) from exc


def check_client_settings(kafka: KafkaConfig) -> None:
    """Raise :class:`~worker.config.ConfigError` naming the ``kafka.client`` setting
    librdkafka refuses, before a worker loads its model or serve starts (they met it
    later, as a raw KafkaError); contacts no broker."""
    logger = logging.getLogger("batchpipe.kafka.settings")
    logger.propagate = False
    logger.handlers = [logging.NullHandler()]
    _admin(kafka, logger, REACH_TIMEOUT_S)


def _admin(kafka: KafkaConfig, logger: logging.Logger, timeout_s: float) -> AdminClient:
    settings: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap_servers, **kafka.client}
    settings |= {"logger": logger, "socket.connection.setup.timeout.ms": int(timeout_s * 1000)}
    try:
        return AdminClient(settings)
    except KafkaException as exc:  # a kafka.client setting librdkafka does not take
        raise ConfigError(client_setting_problem(exc, os.environ)) from exc


def client_setting_problem(exc: KafkaException, environ: Mapping[str, str]) -> str:
    """``exc`` (librdkafka refusing a setting) as a configuration error naming the
    ``kafka.client`` setting and, when one set it, its environment variable."""
    why = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
    named = re.search(r'"([^"]{1,200})"', why)
    if named is None:
        return f"kafka.client: librdkafka refuses it: {why}"
    name = named.group(1)
    line = f"kafka.client.{name}: librdkafka refuses it: {why}"
    variable = ENV_PREFIX + "KAFKA__CLIENT__" + name.replace(".", "_").upper()
    return f"{line} (from environment {variable})" if variable in environ else line


class _QuietHandler(logging.Handler):
    """librdkafka's errors on stderr, one line per :data:`QUIET_EVERY_S` at most."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self._last = -QUIET_EVERY_S

    def emit(self, record: logging.LogRecord) -> None:
        now = time.monotonic()
        if now - self._last < QUIET_EVERY_S:
            return
        self._last = now
        print(f"batchpipe: kafka: {record.getMessage()} (-v: librdkafka's log)", file=sys.stderr)


def kafka_log(verbose: bool) -> logging.Logger:
    """The logger a client command's Kafka clients log to (see the module's docstring)."""
    logger = logging.getLogger("batchpipe.kafka")
    logger.propagate = False
    logger.handlers.clear()
    if verbose:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.setLevel(logging.DEBUG)
    else:
        handler = _QuietHandler()
        logger.setLevel(logging.ERROR)
    logger.addHandler(handler)
    return logger


def quiet_clients(config: Config, verbose: bool) -> Config:
    """``config`` whose Kafka clients log to :func:`kafka_log` instead of stderr."""
    client = {**config.kafka.client, "logger": kafka_log(verbose)}
    return replace(config, kafka=replace(config.kafka, client=client))
