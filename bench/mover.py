"""The feeder's mover alone: how many requests/s one feeder moves from the pending topic
into the requests topic, with no worker in the way (issue 33, item 2).

On the embedded broker, the pending topic is filled with ``batches`` batches written by
two publishers at once (their records interleaved in runs of 200, as two ``submit``s at
the same moment write them), then one :class:`~worker.feeder.mover.Mover` indexes and
moves all of it, its depth limit out of the way. Before the read-ahead the mover sought
for every slice: one batch 27,300 req/s, four 1,725, 64 1,617.

Part of :mod:`bench.fairness` (its ``mover`` figures), which runs it in the same run as
the arms it is compared with.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry

from bench.common import DemandStandin, fresh_config
from worker.config import Config
from worker.feeder.metrics import FeederMetrics
from worker.feeder.mover import Mover
from worker.feeder.naming import (
    ensure_pending,
    pending_headers,
    pending_topic,
    state_topic,
    tokens_header,
)
from worker.kafka import clients

#: two publishers at once interleave their records in runs of this many
RUN = 200
BODY = b'{"custom_id":"x","body":{"model":"echo","messages":[{"role":"user","content":"hi"}]}}'


def _fill(config: Config, batches: int, per_batch: int) -> int:
    """Write ``batches`` batches, pairs of them interleaved in runs of :data:`RUN`."""
    k = config.kafka
    ensure_pending(k, config.limits, [k.requests_topic])
    clients.ensure_topics(k, [k.requests_topic])
    clients.ensure_topics(k, [state_topic(k.requests_topic)], partitions=1, compacted=True)
    producer = clients.producer(k)
    topic = pending_topic(k.requests_topic)
    for pair in range(0, batches, 2):
        names = [f"b{pair + i}" for i in range(min(2, batches - pair))]
        for start in range(0, per_batch, RUN):
            for name in names:
                headers: list[tuple[str, str | bytes | None]] = [
                    *pending_headers(name, 1.0, name),
                    tokens_header(20),
                ]
                for i in range(start, min(per_batch, start + RUN)):
                    producer.produce(topic, BODY, f"{name}-{i}".encode(), headers=headers)
            producer.flush(60)  # a run at a time: never more than the producer's queue
    return batches * per_batch


def measure(bootstrap: str, batches: int, per_batch: int) -> dict[str, Any]:
    config = fresh_config(bootstrap)
    total = _fill(config, batches, per_batch)
    k = config.kafka
    standin = DemandStandin(config, 10_000_000).__enter__()  # no worker: credit aside
    scan = clients.consumer(k, f"{k.group_id}.feeder")
    mover = Mover(config, scan, FeederMetrics(CollectorRegistry()))
    try:
        started, moved = time.perf_counter(), 0
        while moved < total:
            records = [m for m in scan.consume(500, timeout=0.05) if m.error() is None]
            mover.note(records)
            moved += mover.feed()
        seconds = time.perf_counter() - started
    finally:
        mover.close()
        scan.close()
        standin.__exit__()
    return {
        "batches": batches,
        "requests": total,
        "seconds": round(seconds, 2),
        "requests_per_s": round(total / seconds),
        "seeks": mover.ahead.seeks,
    }


def run(bootstrap: str, total: int) -> dict[str, Any]:
    """``total`` requests as one batch, as four and as 64, each on fresh topics."""
    return {str(b): measure(bootstrap, b, total // b) for b in (1, 4, 64)}
