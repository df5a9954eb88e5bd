"""What every route needs — the configuration, keys, state, store, lifecycle — and the
dependencies that hand it and the caller's owner to a route."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from batchpipe.api.auth import Keys
from batchpipe.api.state import StateTopic
from batchpipe.api.store import FileStore
from batchpipe.batchfile import FileLimits
from worker.config import ApiConfig, Config
from worker.routing import RoutingTable

if TYPE_CHECKING:
    from batchpipe.api.lifecycle import Lifecycle
    from batchpipe.api.metrics import ApiMetrics
    from batchpipe.api.webhooks.service import Webhooks
    from batchpipe.fleet import FleetModels


@dataclass(frozen=True)
class Services:
    config: Config
    keys: Keys
    state: StateTopic
    store: FileStore
    lifecycle: Lifecycle
    metrics: ApiMetrics
    webhooks: Webhooks | None = None  # None: the unit tests' in-memory server
    fleet: FleetModels | None = None  # the models the workers announce; None: unknown

    @property
    def limits(self) -> FileLimits:
        return file_limits(self.config.api)

    @property
    def routing(self) -> RoutingTable:
        """Where each model's requests are published (``kafka.routes``)."""
        return RoutingTable.from_kafka(self.config.kafka)


def file_limits(api: ApiConfig) -> FileLimits:
    """The limits on an uploaded file (``api.max_*``)."""
    return FileLimits(
        max_lines=api.max_lines,
        max_file_bytes=api.max_file_bytes,
        max_line_bytes=api.max_line_bytes,
    )


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def owner(request: Request) -> str:
    """The caller's owner from its ``Authorization`` header; 401 without a valid key."""
    return services(request).keys.owner(request.headers.get("authorization"))
