"""Spend against a cap in ``batchpipe status`` and ``list`` (docs/api.md "Cost caps").

A batch created through ``batchpipe serve`` keeps its caps and its model's prices in its
record on the API's state topic (``kafka.state_topic``; :mod:`batchpipe.api.costcap`);
``status`` and ``list`` count tokens from the results topic themselves. This reads the
state topic once, from its beginning to its end (one compacted partition: a record per
file and batch), for the records of the batches shown, and prices their spend. A fleet
without ``serve`` has no state topic: nothing is read and nothing is shown.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import TopicPartition

from batchpipe.api.records import BatchRecord
from batchpipe.collect import BatchStatus
from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

_READ_S = 10.0  # the longest the state topic is read; a slower read shows no spend


def serve_records(kafka: KafkaConfig, batch_ids: Iterable[str]) -> dict[str, BatchRecord]:
    """The state topic's latest record of each of ``batch_ids`` that has one."""
    wanted = {f"batch:{b}" for b in batch_ids}
    topic = kafka.state_topic
    consumer = clients.consumer(kafka, f"{kafka.group_id}.cli-spend", read_committed=False)
    found: dict[str, BatchRecord] = {}
    try:
        if topic not in consumer.list_topics(timeout=_READ_S).topics:
            return found
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=_READ_S)
        consumer.assign([TopicPartition(topic, 0, FROM_START)])
        deadline = time.monotonic() + _READ_S
        while end > 0 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            key, value = (msg.key() or b"").decode(errors="replace"), msg.value()
            if key in wanted:
                if value:
                    found[key.removeprefix("batch:")] = BatchRecord.decode(value)
                else:
                    found.pop(key.removeprefix("batch:"), None)
            if (msg.offset() or 0) + 1 >= end:
                break
    finally:
        consumer.close()
    return found


def spend_of(status: BatchStatus, record: BatchRecord | None) -> dict[str, Any] | None:
    """``batchpipe.spend`` of a batch under a cap, from the tokens ``status`` counted."""
    if record is None or record.cap is None or not record.cap.limits:
        return None
    return record.cap.view(status.prompt_tokens, status.completion_tokens)


def spend_text(spend: dict[str, Any]) -> str:
    """``1,144 of 26,556 tokens, 0.0021 of 2.5 USD, cap reached``, for humans."""
    parts = [f"{spend['tokens']:,} tokens"]
    if spend["max_tokens"] is not None:
        parts = [f"{spend['tokens']:,} of {spend['max_tokens']:,} tokens"]
    if spend["cost_usd"] is not None:
        cap = spend["max_cost_usd"]
        cost = f"{spend['cost_usd']:.4f}"
        parts.append(f"{cost} of {cap:g} USD" if cap is not None else f"{cost} USD")
    if spend["cap_reached_at"] is not None:
        parts.append("cap reached: the lines not run are answered 4008")
    return ", ".join(parts)
