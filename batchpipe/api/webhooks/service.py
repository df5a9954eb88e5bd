"""Webhooks and the events topic as ``batchpipe serve`` runs them: the endpoints and
secrets read at start (a bad entry stops the start, naming it), the address guard, the
sender, the deliverer and the relay, and their series on the API's registry."""

from __future__ import annotations

import time
from collections.abc import Collection

from prometheus_client import CollectorRegistry

from batchpipe.api.webhooks.addresses import AddressGuard
from batchpipe.api.webhooks.deliveries import Deliverer
from batchpipe.api.webhooks.endpoints import load_endpoints
from batchpipe.api.webhooks.metrics import WebhookMetrics
from batchpipe.api.webhooks.relay import EventRelay, KafkaDeliveryLog
from batchpipe.api.webhooks.sender import Sender
from worker.config import Config


class Webhooks:
    def __init__(
        self, config: Config, registry: CollectorRegistry, owners: Collection[str]
    ) -> None:
        api = config.api
        endpoints = load_endpoints(api, owners)
        self._sender = Sender(AddressGuard(api.webhook_allow_networks), api.webhook_timeout_s)
        self._log = KafkaDeliveryLog(config.kafka)
        metrics = WebhookMetrics(registry)
        self.deliverer = Deliverer(api, endpoints, self._sender.send, self._log, metrics)
        self.relay = EventRelay(config, endpoints, self.deliverer)
        metrics.watch(lambda: self.deliverer.oldest_age_s(time.time()), lambda: self.relay.owner)

    def start(self) -> None:
        self.deliverer.start()
        self.relay.start()

    def close(self) -> None:
        self.relay.close()  # hands the partition back: the deliverer lets go of its work
        self.deliverer.close()
        self._log.close()
        self._sender.close()
