"""Per-key series of ``/metrics``: what each API key has queued and has had answered.

Label ``key`` is the key's *owner* (the name in the keys file, never the key): bounded by
the keys file, not by batches. Computed at each scrape from the batches this replica
holds (the state topic) and their live progress, so every replica reports the same
figures, and nothing is kept between scrapes:

- ``batchpipe_api_queued_requests{key}`` / ``batchpipe_api_queued_tokens{key}``: requests
  of the key's batches that have not ended and are not answered yet, and their estimated
  tokens (:mod:`batchpipe.api.quota`: each batch's estimate × its unanswered share);
- ``batchpipe_api_answered_requests_total{key}`` / ``batchpipe_api_answered_tokens_total
  {key}``: requests answered (completed or failed) and their tokens (prompt + completion
  as the workers counted them) over every batch the state topic still holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchpipe.api.records import BatchRecord, Counts, Usage

Progress = Callable[[BatchRecord], tuple[Counts, Usage | None]]


class _KeyCollector(Collector):
    def __init__(
        self, owners: Iterable[str], batches: Iterable[BatchRecord], progress: Progress
    ) -> None:
        self._owners = sorted(set(owners))
        self._batches = batches
        self._progress = progress

    def collect(self) -> Iterator[Metric]:
        names = ("queued_requests", "queued_tokens", "answered_requests", "answered_tokens")
        sums = {owner: dict.fromkeys(names, 0) for owner in self._owners}
        for batch in self._batches:
            row = sums.get(batch.owner)
            if row is None:  # an owner no longer in the keys file: kept off the labels
                continue
            counts, usage = self._progress(batch)
            answered = counts.completed + counts.failed
            row["answered_requests"] += answered
            if usage is not None:
                row["answered_tokens"] += usage.input_tokens + usage.output_tokens
            if not batch.terminal and counts.total:
                left = max(0, counts.total - answered)
                row["queued_requests"] += left
                row["queued_tokens"] += math.ceil(batch.tokens * left / counts.total)
        families: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily(
                "batchpipe_api_queued_requests",
                "Unanswered requests of the key's batches that have not ended.",
                labels=["key"],
            ),
            GaugeMetricFamily(
                "batchpipe_api_queued_tokens",
                "Estimated tokens (prompt + max_tokens) of those requests.",
                labels=["key"],
            ),
            CounterMetricFamily(
                "batchpipe_api_answered_requests",
                "Requests of the key's batches answered (completed or failed).",
                labels=["key"],
            ),
            CounterMetricFamily(
                "batchpipe_api_answered_tokens",
                "Prompt + completion tokens of the key's answered requests.",
                labels=["key"],
            ),
        ]
        for owner, row in sums.items():
            for family, name in zip(families, names, strict=True):
                family.add_metric([owner], row[name])
        yield from families


def key_exposition(
    owners: Iterable[str], batches: Iterable[BatchRecord], progress: Progress
) -> bytes:
    registry = CollectorRegistry()
    registry.register(_KeyCollector(owners, batches, progress))
    return generate_latest(registry)
