"""Webhooks and the events topic (docs/api.md "Webhooks"): :mod:`.endpoints` (each key's
endpoint and secret), :mod:`.signing` (events and Standard Webhooks signatures),
:mod:`.addresses` (the outbound-address guard), :mod:`.sender` (one HTTP attempt),
:mod:`.deliveries` (retries, with their state on Kafka), :mod:`.relay` (the state
topic's changes, exactly once, onto the events topic) and :mod:`.service` (the whole,
as ``batchpipe serve`` runs it)."""
