"""``batchpipe list``: the fleet's batches, newest first, as the SDK's ``batches.list``.

Batches published with ``submit``, ``run`` or the ``Client`` live only on Kafka: their
requests on the requests topics (and, waiting for the feeder, on the pending topics),
their answers on the results topic. A listing reads those topics from ``since`` (by
default one completion window, 24 h, back; ``offsets_for_times``) to their ends: each
batch's first request gives its size and submit time, its answers (once per
``custom_id``) its counts. A batch whose requests are older than ``since`` but whose
answers are not is listed from its answers (its submit time from a generated id). Each
batch is a :class:`~batchpipe.collect.BatchStatus`, as ``status`` answers, tokens
included. Reading is bounded by ``since``: a wider window reads more.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace

from batchpipe.client import Client
from batchpipe.collect import BatchStatus, BatchTally, batch_time, record_headers, records
from worker.errors import RequestError
from worker.feeder.headers import tier_in
from worker.feeder.naming import pending_topic
from worker.wire.codec import decode_request, decode_result


def list_batches(client: Client, since: float, completion_window_s: float) -> list[BatchStatus]:
    """Every batch with a request or an answer on the topics since ``since``, newest first."""
    tallies: dict[str, BatchTally] = {}
    submitted: dict[str, float] = {}
    tiers: dict[str, str] = {}
    routing = client.routing
    for topic in [*routing.topics, *(pending_topic(t) for t in routing.topics)]:
        for value, headers in _values(client, topic, since):
            try:
                req = decode_request(value, headers, client.codec_limits)
            except RequestError:
                continue
            tally = tallies.setdefault(req.batch_id, BatchTally(req.batch_id))
            tally.total = max(tally.total, req.batch_total)
            if req.submitted_at is not None:
                submitted.setdefault(req.batch_id, req.submitted_at)
            tiers.setdefault(req.batch_id, tier_in(headers))
    for value, headers in _values(client, client.config.kafka.results_topic, since):
        try:
            result = decode_result(value, headers, client.codec_limits)
        except RequestError:
            continue
        tallies.setdefault(result.batch_id, BatchTally(result.batch_id)).add(result)
    now = time.time()
    found = [
        replace(
            tally.status(
                submitted_at=submitted.get(batch_id) or batch_time(batch_id),
                now=now,
                completion_window_s=completion_window_s,
                price_per_1k=None,
            ),
            tier=tiers.get(batch_id),
        )
        for batch_id, tally in tallies.items()
        if batch_id
    ]
    return sorted(found, key=lambda b: (b.submitted_at or 0.0, b.batch_id), reverse=True)


def _values(
    client: Client, topic: str, since: float
) -> Iterable[tuple[bytes | None, list[tuple[str, str | bytes | None]]]]:
    reader = client.reader(topic, since)
    if reader is None:
        return
    consumer, partitions = reader
    try:
        for msg in records(consumer, partitions, until_end=True, deadline=None):
            yield msg.value(), record_headers(msg)
    finally:
        consumer.close()


def shown(batch_id: str) -> str:
    """``batch_id`` for a terminal: anyone who can write to the topics names batches, so
    one with a control character (an escape sequence) is shown escaped, and cut."""
    text = batch_id if batch_id.isprintable() else repr(batch_id)
    return text if len(text) <= 300 else text[:300] + "..."


def format_listing(batches: list[BatchStatus]) -> str:
    """One line per batch: id, state, counts and submit time (UTC)."""
    lines = []
    for b in batches:
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(b.submitted_at))
            if b.submitted_at is not None
            else "?"
        )
        lines.append(
            f"{shown(b.batch_id)}  {b.state:<11}  "
            f"{b.completed + b.failed}/{b.total or '?'} answered "
            f"({b.completed} completed, {b.failed} failed)  submitted {when} UTC"
            + (f"  tier {b.tier}" if b.tier is not None else "")
        )
    return "\n".join(lines)
