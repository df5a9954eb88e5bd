"""The arms of :mod:`bench.fairness` and :mod:`bench.fairness_variants`: a worker on fresh
topics with fair share on or off, the batches they submit, and a reader of the answers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Literal

from batchpipe.client import Client
from bench.common import fresh_config
from bench.latency import Seen, read_answers, wait_for
from tests.integration.harness import running_worker
from worker.config import Config, EngineConfig
from worker.kafka import clients


def lines(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo", "messages": [{"role": "user", "content": f"{prefix} {i}"}]},
        }
        for i in range(n)
    ]


class Arm:
    """A worker on fresh topics with fair share on or off, and a reader of its answers."""

    def __init__(
        self,
        bootstrap: str,
        token_s: float,
        fair: bool,
        echo_mode: Literal["static", "in_flight"] = "static",
    ) -> None:
        config = fresh_config(bootstrap)
        engine = EngineConfig(
            kind="echo", model="echo", simulated_token_s=token_s, echo_mode=echo_mode
        )
        self.config: Config = replace(
            config,
            engine=engine,
            generation=replace(config.generation, max_tokens=4),
            scheduling=replace(config.scheduling, fair=fair),
        )
        k = self.config.kafka
        # the reader is assigned the results partitions that exist when it starts
        clients.ensure_topics(k, [k.requests_topic, k.results_topic, k.dead_letter_topic])
        self.client = Client(self.config)
        self.seen = Seen({}, threading.Lock())
        self.submitted: dict[str, float] = {}

    def submit(self, prefix: str, n: int) -> list[str]:
        return self.publish(prefix, lines(prefix, n))[1]

    def publish(self, prefix: str, rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
        """Submit ``rows`` as one batch named ``prefix``, under its own key ``prefix``: its
        batch id and custom_ids. Each batch is a tenant of its own, as on a shared fleet;
        under one key the virtual tags a worker orders by are the key's, so one key's
        batches run slice after slice, whatever their sizes (§10)."""
        self.submitted[prefix] = time.time()
        receipt = self.client.submit(rows, key=prefix)
        return receipt.batch_id, [str(row["custom_id"]) for row in rows]

    def done_at(self, ids: Sequence[str]) -> float:
        with self.seen.lock:
            return max(self.seen.answers[i][0] for i in ids)

    def answered_between(self, ids: Sequence[str], start: float, end: float) -> int:
        with self.seen.lock:
            return sum(1 for i in ids if start <= self.seen.answers[i][0] <= end)


@contextlib.contextmanager
def serving(arm: Arm, workers: int = 1) -> Iterator[Arm]:
    """``arm`` with ``workers`` workers running and its answers read, once one request
    went through (groups joined, the feeder holds the pending partition)."""
    stop = threading.Event()
    reader = threading.Thread(target=read_answers, args=(arm.config, arm.seen, stop), daemon=True)
    reader.start()
    try:
        with contextlib.ExitStack() as fleet:
            for _ in range(workers):
                fleet.enter_context(running_worker(arm.config))
            wait_for(arm.seen, arm.submit("warm", 1), 120)
            yield arm
    finally:
        stop.set()
        reader.join(10)
