"""The feeder's metrics, in the worker's registry (docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from batcher.tiers import TIERS


class FeederMetrics:
    """Thread-safe: the feeder's thread sets them, the metrics server reads them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._depth = Gauge(
            "batchpipe_feeder_depth",
            "Records the feeder shared into the requests topic that no worker has read yet.",
            registry=registry,
        )
        self._limit = Gauge(
            "batchpipe_feeder_depth_limit",
            "That plus the workers' credit: what the topic may hold (running + one batch each).",
            registry=registry,
        )
        self._active = Gauge(
            "batchpipe_feeder_active_batches",
            "Batches with requests waiting in the pending topic.",
            registry=registry,
        )
        self._fed = Counter(
            "batchpipe_feeder_fed",
            "Requests moved from the pending topic into the requests topic.",
            registry=registry,
        )
        self._quarantined = Counter(
            "batchpipe_feeder_quarantined",
            "Batches the feeder quarantined: a record or slice of theirs raised; their requests "
            "are answered 4007 naming why.",
            registry=registry,
        )
        self._abandoned = Counter(
            "batchpipe_feeder_abandoned",
            "Records marked fed and never moved: unreadable records of quarantined batches, "
            "or a sealed batch whose end marker never came or counts more records than were read.",
            registry=registry,
        )
        self._trim_supported = Gauge(
            "batchpipe_feeder_trim_supported",
            "0 once the broker refused to delete records: the pending topic is not trimmed.",
            registry=registry,
        )
        self._trimmed = Gauge(
            "batchpipe_feeder_trimmed_offset",
            "Records of the pending partition below this offset were fed and deleted.",
            registry=registry,
        )
        self._owner = Gauge(
            "batchpipe_feeder_owner",
            "1 while this worker's feeder holds the pending partition (one per fleet).",
            registry=registry,
        )

        self._tier_waiting = Gauge(
            "batchpipe_feeder_tier_waiting",
            "Requests waiting in the pending topic to be fed, by their batch's service tier.",
            ["tier"],
            registry=registry,
        )
        self._tier_fed = Counter(
            "batchpipe_feeder_tier_fed",
            "Requests fed by fair share, by their batch's service tier.",
            ["tier"],
            registry=registry,
        )
        for tier in TIERS:  # every tier shows, at 0 before its first batch
            self._tier_waiting.labels(tier)
            self._tier_fed.labels(tier)

    def owner(self, owns: bool) -> None:
        self._owner.set(1 if owns else 0)

    def depth(self, depth: int, limit: int) -> None:
        self._depth.set(depth)
        self._limit.set(limit)

    def active(self, batches: int) -> None:
        self._active.set(batches)

    def fed(self, count: int) -> None:
        self._fed.inc(count)

    def tiers(self, waiting: Mapping[str, int], fed: Mapping[str, int]) -> None:
        for tier in TIERS:
            self._tier_waiting.labels(tier).set(waiting.get(tier, 0))
            if fed.get(tier):
                self._tier_fed.labels(tier).inc(fed[tier])

    def quarantined(self, batches: int, abandoned: int) -> None:
        self._quarantined.inc(batches)
        self._abandoned.inc(abandoned)

    def trimmed(self, supported: bool, offset: int) -> None:
        self._trim_supported.set(1 if supported else 0)
        self._trimmed.set(offset)
