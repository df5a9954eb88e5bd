"""The feeder's memory and speed at scale: 1,000 active batches × 10,000 requests × 4 KB
from interleaved publishers (issue 38).

Before: ``READ_AHEAD_BYTES`` was checked at the scan only, so refills held 15,286 MiB
against a 64 MiB budget after 102k records; one batch read back at a time took 8,362
seeks and re-read 42× the data with publishers interleaved in chunks of 20.

The pending partition here is 40 GB, which cannot go through the embedded broker on this
machine (24 GiB of memory, 2 cores shared): it is an in-memory *source* that makes each
record when it is read — a fresh 4 KB value (so every record kept costs real memory),
the headers a publisher writes, 1,000 publishers interleaved in chunks of 20 records —
read through the consumer surface the feeder uses (``assign`` is a seek, ``consume``
reads on). Everything else is the real feeder: :class:`~worker.feeder.plan.Planner` with
the real :class:`~worker.feeder.index.PendingIndex`,
:class:`~worker.feeder.readahead.ReadAhead`, :class:`~batcher.tiers.Tiers` and
drain, and :func:`~worker.feeder.forward.forward` into a producer that drops what it is
given (the broker's own cost is measured by ``bench.mover``).

Two phases, as a feeder meets a backlog published before it started: the scan indexes
the whole partition (10M records: the index at its largest; its records/s is the
indexing rate), then the mover moves ``--move`` records with every batch still active,
slices chosen by fair share. RSS (``/proc/self/statm``) is sampled throughout; the figure
is the peak above the RSS at the start, after the source was built.

    python -m bench.feeder_memory [--batches 1000] [--per-batch 10000] [--move 2000000]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Message, TopicPartition

from batcher.tiers import Tiers
from bench.common import write_result
from worker.feeder import readahead
from worker.feeder.forward import forward
from worker.feeder.headers import Charging
from worker.feeder.index import PendingIndex
from worker.feeder.naming import pending_headers, tokens_header
from worker.feeder.plan import Planner
from worker.feeder.readahead import ReadAhead
from worker.feeder.stops import Drain
from worker.kafka.cancellations import Cancellations

CHUNK = 20  # a publisher's records in a row before another's
SIZE = 4096
POOL = random.Random(7).randbytes(1 << 20)
PAGE = os.sysconf("SC_PAGE_SIZE")


class Record:
    """A consumed record: the surface the feeder reads."""

    __slots__ = ("_headers", "_key", "_offset", "_value")

    def __init__(self, offset: int, key: bytes, value: bytes, headers: list[Any]) -> None:
        self._offset, self._key, self._value, self._headers = offset, key, value, headers

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[Any]:
        return self._headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "pending"

    def partition(self) -> int:
        return 0


class Source:
    """``batches`` publishers × ``per_batch`` records, interleaved in chunks of CHUNK."""

    def __init__(self, batches: int, per_batch: int) -> None:
        self.batches, self.total = batches, batches * per_batch
        self._headers = [
            [*pending_headers(f"b{b}", 1.0, f"k{b}"), tokens_header(300)] for b in range(batches)
        ]
        self.at = 0

    def record(self, offset: int) -> Message:
        chunk = offset // CHUNK
        batch = chunk % self.batches
        nth = chunk // self.batches * CHUNK + offset % CHUNK
        start = (offset * 4099) % (len(POOL) - SIZE)
        value = POOL[start : start + SIZE]  # a copy: every record its own 4 KB
        key = f"b{batch}-{nth}".encode()
        return Record(offset, key, value, self._headers[batch])  # type: ignore[return-value]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.at = partitions[0].offset

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> Sequence[Message]:
        end = min(self.total, self.at + num_messages)
        taken = [self.record(o) for o in range(self.at, end)]
        self.at = end
        return taken


class Control:
    def read(self) -> list[bytes]:
        return []

    def close(self) -> None:
        """Nothing to close."""


class Dropping:
    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        """The broker's side is bench.mover's: here a record produced is gone."""


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(batches: int, per_batch: int, move: int) -> dict[str, Any]:
    source, scan = Source(batches, per_batch), Source(batches, per_batch)
    index, fair = PendingIndex(), Tiers(64)
    ahead = ReadAhead(source, "pending", index)
    drain = Drain(Cancellations(Control()), fair, index)
    planner = Planner(index, fair, ahead, drain, Charging())
    producer = Dropping()
    start_rss = peak = rss()

    scan_s = 0.0  # the feeder's indexing alone, not the source making records
    while scan.at < scan.total:  # the scan, 500 records a call as the feeder's
        records = scan.consume(500)
        started = time.perf_counter()
        planner.note(records)
        scan_s += time.perf_counter() - started
        if scan.at % 200_000 == 0:
            peak = max(peak, rss())
    peak = max(peak, rss())
    after_scan = rss() - start_rss

    started, moved, steps = time.perf_counter(), 0, 0
    last: dict[str, int] = {}  # per batch, the last request moved: each once, in order
    in_order = True
    while moved < move:
        step = planner.plan(512, 512)
        for batch_id, records in step.slices:
            for m in records:
                forward(producer, "requests", "dead", m, lambda *_: None)
                nth = int((m.key() or b"").rsplit(b"-", 1)[1])
                in_order = in_order and nth == last.get(batch_id, -1) + 1
                last[batch_id] = nth
        moved += step.moved
        steps += 1
        if steps % 50 == 0:
            peak = max(peak, rss())
    move_s = time.perf_counter() - started
    peak = max(peak, rss())
    return {
        "batches": batches,
        "per_batch": per_batch,
        "record_bytes": SIZE,
        "chunk": CHUNK,
        "pending_bytes": batches * per_batch * SIZE,
        "read_ahead_bytes": readahead.READ_AHEAD_BYTES,
        "indexed_records": scan.total,
        "index_records_per_s": round(scan.total / scan_s),
        "rss_after_index_mib": round(after_scan / 2**20, 1),
        "moved": moved,
        "moved_once_each_in_order": in_order,
        "active_batches_at_end": len(fair),
        "move_requests_per_s": round(moved / move_s),
        "peak_rss_above_start_mib": round((peak - start_rss) / 2**20, 1),
        "peak_kept_mib": round(ahead.peak_bytes / 2**20, 1),
        "seeks": ahead.seeks,
        "records_read_back": ahead.reads,
        "read_back_per_moved": round(ahead.reads / max(moved, 1), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--per-batch", type=int, default=10_000)
    parser.add_argument("--move", type=int, default=2_000_000)
    args = parser.parse_args()
    result = measure(args.batches, args.per_batch, args.move)
    result["source"] = (
        "in-memory pending partition made as it is read (40 GB cannot go through the "
        "embedded broker on a 24 GiB machine); the real Planner, PendingIndex, ReadAhead, "
        "Tiers, Drain and forward(); a producer that drops records"
    )
    result["goals"] = {"peak_rss_above_start_mib": 256, "move_requests_per_s": 20_000}
    path = write_result("feeder_memory", result)
    print(path.read_text())


if __name__ == "__main__":
    main()
