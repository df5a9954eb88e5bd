"""A worker's demand report: what it holds unanswered and what its engine can take.

The feeder sizes what it feeds each worker from these reports (docs/architecture.md §10,
:mod:`worker.feeder.credits`), not from the worker group's committed offsets: a
committed offset stops at a partition's oldest unanswered record, so one long
generation made everything answered behind it count as backlog (issue 39). A report is
a small JSON record keyed by the worker's id on the compacted topic
``<requests_topic>.demand``, written at most every :data:`REPORT_S` while it changes and
every :data:`ALIVE_S` while it does not; a worker that stops reporting loses its credit.

- ``positions``: per requests-topic partition it holds, the next offset it will read;
- ``held``: requests read and not answered yet (running or waiting in the worker);
  records answered at admission without running (cancelled, expired, quarantined) never
  count, nor does an answer waiting for its commit;
- ``running``: of those, how many hold an engine slot now (``prefetch_count``); ``free``:
  how many more slots it could fill now;
- ``unanswered``: per partition, the records read there and not answered yet (admitted or
  read ahead): what a record written there now would wait behind before its answer may be
  published (answers leave a partition in offset order, :mod:`worker.kafka.transactions`),
  so the feeder writes a newly active batch where the least waits (§10). Optional: a
  report without it says nothing waits.
- ``flex``: false while its engine starts no flex-tier request (a remote engine's server
  under pressure, :mod:`worker.engines.remote.gate`): the feeder feeds it no flex then.
  Optional: a report without it (an older worker) takes flex.

Anyone who can write the topic writes a report, so :func:`decode` bounds every field and
returns None for anything else: a bad report gives its key no credit, never an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import isfinite
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from batcher import Admission
from worker.config import KafkaConfig
from worker.kafka import clients

#: the least time between two reports while the worker's demand changes
REPORT_S = 0.1
#: a report at least this often while nothing changes (the feeder's liveness signal)
ALIVE_S = 1.0
#: the longest report read, the most partitions it may name, the largest count in it
MAX_REPORT_BYTES = 64 * 1024
MAX_PARTITIONS = 4096
MAX_COUNT = 1 << 40


def demand_topic(requests_topic: str) -> str:
    return f"{requests_topic}.demand"


@dataclass(frozen=True)
class Demand:
    worker: str
    at: float  # the worker's wall clock when it wrote the report
    positions: tuple[tuple[int, int], ...]  # (partition, next offset to read)
    held: int
    running: int
    free: int
    unanswered: tuple[tuple[int, int], ...] = ()  # (partition, records read, not answered)
    flex: bool = True  # its engine starts flex-tier requests now

    def encode(self) -> bytes:
        return json.dumps(
            {
                "at": self.at,
                "positions": [list(p) for p in self.positions],
                "held": self.held,
                "running": self.running,
                "free": self.free,
                "unanswered": [list(p) for p in self.unanswered],
                "flex": self.flex,
            },
            separators=(",", ":"),
        ).encode()


def decode(key: bytes | None, value: bytes | None) -> Demand | None:
    """The report ``value`` written under ``key``; None for a tombstone or anything else."""
    if key is None or value is None or len(key) > 256 or len(value) > MAX_REPORT_BYTES:
        return None
    try:
        raw = json.loads(value)
        worker = key.decode()
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting: any bytes come
        return None
    if not isinstance(raw, dict):
        return None
    counts = [raw.get(name) for name in ("held", "running", "free")]
    at, positions = raw.get("at"), raw.get("positions")
    if not all(_count(c) for c in counts) or not isinstance(at, (int, float)) or not isfinite(at):
        return None
    held, running, free = (int(c) for c in counts if c is not None)
    pairs, waiting = _pairs(positions), _pairs(raw.get("unanswered", []))
    flex = raw.get("flex", True)
    if pairs is None or waiting is None or not isinstance(flex, bool):
        return None
    return Demand(worker, float(at), pairs, held, min(running, held), free, waiting, flex)


def _pairs(value: Any) -> tuple[tuple[int, int], ...] | None:
    """A list of at most MAX_PARTITIONS ``[partition, count]`` pairs; None for anything else."""
    if not isinstance(value, list) or len(value) > MAX_PARTITIONS:
        return None
    pairs: list[tuple[int, int]] = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(_count(v) for v in pair)):
            return None
        pairs.append((pair[0], pair[1]))
    return tuple(pairs)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


class Producing(Protocol):
    def produce(self, topic: str, *, key: bytes, value: bytes) -> None: ...


class Reporter:
    """Decides when a worker writes its report: one :meth:`step` per loop step."""

    def __init__(self, worker: str, topic: str, producer: Producing) -> None:
        self._worker, self._topic, self._producer = worker, topic, producer
        self._sent_at = float("-inf")
        self._last: tuple[object, ...] | None = None

    def step(
        self,
        now: float,
        positions: dict[int, int],
        held: int,
        running: int,
        free: int,
        wall: float | None = None,
        unanswered: Mapping[int, int] | None = None,
        flex: bool = True,
    ) -> bool:
        """Report if due at ``now`` (monotonic; ``wall``, the wall clock written in the
        report, defaults to it); True when a report was written."""
        waiting = tuple(sorted((unanswered or {}).items()))
        state = (tuple(sorted(positions.items())), held, running, free, waiting, flex)
        since = now - self._sent_at
        if since < REPORT_S or (state == self._last and since < ALIVE_S):
            return False
        at = now if wall is None else wall
        report = Demand(self._worker, at, state[0], held, running, free, waiting, flex)
        self._producer.produce(self._topic, key=self._worker.encode(), value=report.encode())
        self._sent_at, self._last = now, state
        return True


class Assigned(Protocol):
    def assignment(self) -> list[TopicPartition]: ...


class DemandWriter:
    """A worker's reports on a plain producer: one :meth:`step` per loop step."""

    def __init__(self, kafka: KafkaConfig, worker: str) -> None:
        topic = demand_topic(kafka.requests_topic)
        clients.ensure_topics(kafka, [topic], partitions=1, compacted=True)
        self._producer = clients.producer(kafka)
        self._reporter = Reporter(worker, topic, self._producer)
        self._due = 0.0

    def step(
        self,
        now: float,
        consumer: Assigned | None,
        read_to: Mapping[tuple[str, int], int],
        admission: Admission,
        waiting: int,
        unanswered: Callable[[tuple[str, int]], int],
        flex: bool = True,
    ) -> None:
        """Report, when due, the partitions ``consumer`` holds with the next offset it
        reads (``read_to``; 0 when nothing was read yet: all the feeder wrote there is
        unread) and the records read there and not answered (``unanswered``), the
        ``admission``'s slots and the ``waiting`` records read past them."""
        if now < self._due or consumer is None:
            return
        self._due = now + REPORT_S
        assigned = [(tp.topic, tp.partition) for tp in consumer.assignment()]
        positions = {p: read_to.get((t, p), 0) for t, p in assigned}
        behind = {p: n for t, p in assigned if (n := unanswered((t, p)))}
        inflight = admission.inflight
        free = max(0, admission.room)
        self.report(now, positions, inflight + waiting, inflight, free, behind, flex)

    def report(
        self,
        now: float,
        positions: dict[int, int],
        held: int,
        running: int,
        free: int,
        unanswered: Mapping[int, int] | None = None,
        flex: bool = True,
    ) -> None:
        """Write a report if one is due (:class:`Reporter`)."""
        self._reporter.step(now, positions, held, running, free, time.time(), unanswered, flex)
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(5.0)


class DemandReader:
    """The feeder's side: every report written since it last looked, without waiting."""

    def __init__(self, kafka: KafkaConfig) -> None:
        topic = demand_topic(kafka.requests_topic)
        clients.ensure_topics(kafka, [topic], partitions=1, compacted=True)
        self._consumer = clients.consumer(
            kafka, f"{kafka.group_id}.feeder-demand", read_committed=False
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    def poll(self, on_report: Callable[[Demand | None, str | None], None]) -> None:
        for m in self._consumer.consume(1000, timeout=0.0):
            if m.error() is not None:
                continue  # end of partition, or a broker hiccup: the next poll reads on
            key = m.key()
            value = m.value()
            name = key.decode(errors="replace") if isinstance(key, bytes) else None
            on_report(decode(key, value), name if value is None else None)

    def close(self) -> None:
        self._consumer.close()
