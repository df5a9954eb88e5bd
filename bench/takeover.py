"""What a partition's next owner reads at takeover, as the answers behind it grow.

The worker's exactly-once publisher (``TransactionalPublisher`` with the progress topic,
docs/architecture.md §2 "Answers on completion") answers one requests partition on the
embedded broker: one straggler at offset 0 that is never answered, so the committed offset
stays there, and a window of ``--window`` other unanswered offsets moving along, so every
progress record lists ``--window`` + 1 offsets; ``--per-commit`` answers per transaction.
At each checkpoint (1,000 to ``--answers`` answers) a fresh publisher resumes the
partition, as a next owner does on assignment, three times: the time of ``resume`` (one
committed-offsets call, one progress record read), the record's size, and the progress
partition's length (records written so far). Issue 48's bound: the read stays one record
whatever the history.

    python -m bench.takeover [--answers 1000000]

Run alone (minutes): ``flock /tmp/heavy.lock python -m bench.takeover``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from functools import partial
from typing import Any

from confluent_kafka import TopicPartition

from batcher import OffsetTracker, Partition
from bench.common import fresh_config, write_result
from worker.config import KafkaConfig
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.kafka.progress import KafkaProgressLog, progress_topic
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import TransactionalPublisher

CHECKPOINTS = (1_000, 10_000, 100_000, 1_000_000)


def _publisher(k: KafkaConfig, tracker: OffsetTracker) -> TransactionalPublisher:
    return TransactionalPublisher(
        k,
        clients.consumer(k),
        tracker,
        clients.Producers(k, 1_000_000),
        "bench-takeover",
        BrokerStableCheck(k),
        progress=KafkaProgressLog(k, 1),
    )


def _takeover(k: KafkaConfig, origin: Partition) -> dict[str, Any]:
    times, unanswered = [], 0
    for _ in range(3):
        tracker = OffsetTracker()
        reader = _publisher(k, tracker)
        start = time.perf_counter()
        reader.resume([origin], 30)
        times.append(time.perf_counter() - start)
        progress = tracker.progress(origin)
        assert progress is not None, "no progress record read"
        unanswered = len(progress.unanswered)
        reader.close()
    consumer = clients.consumer(k)
    (pointer,) = consumer.committed([TopicPartition(progress_topic(k.requests_topic), 0)], 30)
    log = KafkaProgressLog(k, 1)
    value = log.read({origin: pointer.offset - 1})[origin] or b""
    consumer.close()
    return {
        "resume_ms_median": round(1000 * statistics.median(times), 1),
        "resume_ms": [round(1000 * t, 1) for t in times],
        "record_bytes": len(value),
        "unanswered_listed": unanswered,
        "progress_records_written": pointer.offset,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=CHECKPOINTS[-1])
    parser.add_argument("--per-commit", type=int, default=2_000)
    parser.add_argument("--window", type=int, default=63)
    args = parser.parse_args(argv)
    rng = random.Random(48)
    rows: list[dict[str, Any]] = []
    with EmbeddedBroker() as broker:
        config = fresh_config(broker.bootstrap)
        k = replace(config.kafka, partitions=1)
        clients.ensure_topics(
            k, [k.requests_topic, k.results_topic, progress_topic(k.requests_topic)]
        )
        origin: Partition = (k.requests_topic, 0)
        tracker = OffsetTracker()
        writer = _publisher(k, tracker)
        writer.assign([origin])
        tracker.add(origin, 0)  # the straggler: never answered
        waiting: list[int] = []
        offset, answered, start = 0, 0, time.perf_counter()
        for checkpoint in (c for c in CHECKPOINTS if c <= args.answers):
            while answered < checkpoint:
                for _ in range(min(args.per_commit, checkpoint - answered)):
                    offset += 1
                    tracker.add(origin, offset)
                    waiting.append(offset)
                    if len(waiting) > args.window:  # answer one of the window, at random
                        done = waiting.pop(rng.randrange(len(waiting)))
                        writer.send(
                            k.results_topic,
                            str(done),
                            b"a",
                            [],
                            origin,
                            partial(tracker.done, origin, done),
                            done,
                        )
                        answered += 1
                writer.commit()
            row = {"answers": answered, "write_s": round(time.perf_counter() - start, 1)}
            row |= _takeover(k, origin)
            print(row, flush=True)
            rows.append(row)
        writer.close()
    payload = {
        "rows": rows,
        "per_commit": args.per_commit,
        "window": args.window,
        "command": "python -m bench.takeover",
    }
    write_result("takeover", payload)
    return payload


if __name__ == "__main__":
    main()
