"""Kafka I/O: client settings, topic creation, the publishers (exactly-once and
at-least-once), produce-with-retry, and the embedded broker used by tests and the demo."""
