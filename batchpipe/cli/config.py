"""A command's configuration, and the :class:`~batchpipe.client.Client` made of it once
the broker answered."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from batchpipe.client import Client
from batchpipe.reach import bootstrap_source, check_broker, quiet_clients
from worker.config import Config, ConfigError, load_config


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


def connected_client(args: argparse.Namespace) -> Client:
    """A :class:`Client` of the command's configuration, once the broker answered."""
    client = Client(quiet_clients(load(args), args.verbose))
    reach(args, client)
    return client


def reach(args: argparse.Namespace, client: Client) -> None:
    """One line naming the address and its source when no broker answers there."""
    source = bootstrap_source(
        shortcut=args.bootstrap, sets=args.set, environ=os.environ, config_file=args.config
    )
    check_broker(client.config.kafka, source, verbose=args.verbose)
