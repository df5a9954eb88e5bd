"""What a new batch costs the API's results reader on a large results topic.

One batch of ``--results`` answers, written an hour ago, is followed to the end; then a
batch first seen on the state topic (another replica's) appears. Measured: the records
read and the seconds until the reader is at the topic's end again —

- **step back** (``batchpipe/api/follow.py``): the reader steps back to the new batch's
  submit time (less the clock skew), so it reads only what was written since;
- **from the start** (the lifecycle before issue 24): the reader is reopened at the
  earliest submit time of every unfinished batch and reads the whole topic again.

    .venv/bin/python -m tests.integration.api.reread [--results 1000000]

It prints the figures (docs/api.md quotes them); ``test_results_reread.py`` uses its
helpers on a small topic.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from msgspec import structs

from batchpipe.api.follow import ResultsFollower
from batchpipe.api.records import BatchRecord, Counts
from batchpipe.collect import new_batch_id
from tests.integration.harness import isolated_config
from worker.config import Config
from worker.errors import ErrorCode
from worker.kafka import clients
from worker.kafka.broker import EmbeddedBroker
from worker.loop.jobs import Identity, failed
from worker.wire.codec import encode_result


def write_results(config: Config, batch_id: str, count: int, at: float, total: int) -> None:
    """``count`` answers of ``batch_id`` (of ``total`` requests), timestamped ``at``."""
    kafka = config.kafka
    clients.ensure_topics(kafka, [kafka.results_topic], partitions=kafka.partitions)
    producer = clients.producer(kafka)
    identity = Identity(worker_id="bench", model="echo")
    for i in range(count):
        answer = failed(f"r{i}", ErrorCode.ENGINE_FAILED, "x", identity=identity)
        value, encoded = encode_result(
            structs.replace(answer, batch_id=batch_id, batch_total=total)
        )
        headers: list[tuple[str, str | bytes | None]] = list(encoded)
        while True:
            try:
                producer.produce(
                    kafka.results_topic, value, key=f"r{i}".encode(), headers=headers,
                    timestamp=int(at * 1000),
                )  # fmt: skip
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise TimeoutError("results not delivered")


def batch(batch_id: str, total: int) -> BatchRecord:
    now = int(time.time())
    return BatchRecord(
        id=batch_id,
        owner="bench",
        input_file_id="file-bench",
        endpoint="/v1/chat/completions",
        completion_window="24h",
        created_at=now,
        expires_at=now + 86400,
        status="in_progress",
        counts=Counts(total=total),
    )


def follow_until(follower: ResultsFollower, active: list[BatchRecord], records: int) -> float:
    """Follow until the reader has read ``records`` in all; the seconds it took."""
    start = time.monotonic()
    while follower.records_read < records:
        follower.follow(active)
        if time.monotonic() - start > 600:
            raise TimeoutError(f"read {follower.records_read} of {records} records")
    return time.monotonic() - start


def at_end_after(follower: ResultsFollower, active: list[BatchRecord], idle_s: float) -> float:
    """Follow until nothing new was read for ``idle_s``; the seconds until the last read."""
    start = time.monotonic()
    last, last_at = follower.records_read, start
    while time.monotonic() - last_at < idle_s:
        follower.follow(active)
        if follower.records_read != last:
            last, last_at = follower.records_read, time.monotonic()
    return last_at - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=int, default=200_000)
    args = parser.parse_args(argv)
    count = args.results
    an_hour_ago = time.time() - 3600
    old = batch(new_batch_id(an_hour_ago), count + 1)  # never complete: stays followed
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as logs:
        answers = Path(logs)
        config = isolated_config(broker.bootstrap, prefix="reread")
        started = time.monotonic()
        write_results(config, old.id, count, an_hour_ago, count + 1)
        write_s = time.monotonic() - started
        rows = {}
        for mode in ("step_back", "from_start"):
            # marks every 0.2 s and 1 s of clock skew: the run lasts seconds, not hours
            follower = ResultsFollower(config, answers, clock_skew_s=1.0, mark_every_s=0.2)
            first_s = follow_until(follower, [old], count)
            at_end_after(follower, [old], idle_s=1.5)  # a mark at the end, 1 s old
            new = batch(new_batch_id(time.time()), 10)
            before = follower.records_read
            if mode == "from_start":  # what the lifecycle did for every new batch:
                follower.close()  # a reader (and counts) from the oldest batch again
                follower = ResultsFollower(config, answers)
                before = 0
            seconds = at_end_after(follower, [old, new], idle_s=2.0)
            rows[mode] = {
                "first_read_s": round(first_s, 2),
                "new_batch_records_read": follower.records_read - before,
                "new_batch_s": round(seconds, 2),
            }
            follower.close()
            print(mode, rows[mode], flush=True)
    print(json.dumps({"results_on_topic": count, "write_s": round(write_s, 1), **rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
