"""Per-key series of ``/metrics`` for cost caps (:mod:`batchpipe.api.costcap`).

Label ``key`` is the key's owner, as in :mod:`batchpipe.api.keymetrics`; computed at each
scrape from the batches this replica holds and their live spend, nothing kept between:

- ``batchpipe_api_capped_batches{key}``: the key's batches under a cap that have not ended;
- ``batchpipe_api_capped_spent_tokens{key}`` / ``batchpipe_api_capped_max_tokens{key}``:
  the tokens (prompt + completion) those batches spent, and the sum of their token caps
  (a batch capped in money only adds its spend, not a cap);
- ``batchpipe_api_capped_spent_usd{key}``: their cost where their model has a price;
- ``batchpipe_api_cap_reached_total{key}``: the key's batches stopped at their cap, over
  every batch the state topic still holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchpipe.api.keymetrics import Progress
from batchpipe.api.records import BatchRecord

_HELP = {
    "capped_batches": "The key's batches under a token or cost cap that have not ended.",
    "capped_spent_tokens": "Prompt + completion tokens those batches spent so far.",
    "capped_max_tokens": "The sum of those batches' token caps.",
    "capped_spent_usd": "What those batches spent so far in USD, at api.prices.",
    "cap_reached": "The key's batches stopped at their cap (4008 for the lines not run).",
}


class _CapCollector(Collector):
    def __init__(
        self, owners: Iterable[str], batches: Iterable[BatchRecord], progress: Progress
    ) -> None:
        self._owners = sorted(set(owners))
        self._batches = batches
        self._progress = progress

    def collect(self) -> Iterator[Metric]:
        sums = {owner: dict.fromkeys(_HELP, 0.0) for owner in self._owners}
        for batch in self._batches:
            row = sums.get(batch.owner)
            cap = batch.cap
            if row is None or cap is None or not cap.limits:
                continue
            if cap.reached_at is not None:
                row["cap_reached"] += 1
            if batch.terminal:
                continue
            spend = batch.spend(self._progress(batch)[1])
            row["capped_batches"] += 1
            row["capped_spent_tokens"] += spend["tokens"]
            row["capped_max_tokens"] += cap.max_tokens or 0
            row["capped_spent_usd"] += spend["cost_usd"] or 0.0
        for name, text in _HELP.items():
            kind = CounterMetricFamily if name == "cap_reached" else GaugeMetricFamily
            family = kind(f"batchpipe_api_{name}", text, labels=["key"])
            for owner, row in sums.items():
                family.add_metric([owner], row[name])
            yield family


def cap_exposition(
    owners: Iterable[str], batches: Iterable[BatchRecord], progress: Progress
) -> bytes:
    registry = CollectorRegistry()
    registry.register(_CapCollector(owners, batches, progress))
    return generate_latest(registry)
