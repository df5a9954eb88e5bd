"""The live progress of the batches that have not ended, counted from the results topic.

One read_committed reader follows the results topic forward; a tally per batch counts
each ``custom_id`` once. The reader never re-reads more than a new batch needs:

* a batch created on this replica is :meth:`~ResultsFollower.register`-ed before its
  requests are published, so its results all lie ahead of the reader: no re-read;
* a batch first seen on the state topic (another replica's, or every unfinished batch at
  start) may have results the reader already passed: the reader steps back to where it
  was at that batch's submit time (less the clock skew) — from its own marks of where it
  stood when, or from the broker's time index, whichever is later — and never past where
  it already is on a partition. Records read twice count once.

The marks matter: the embedded broker (Tansu 0.6) answers every ``offsets_for_times``
with offset 0, so the broker's index alone would re-read the whole topic there.

So the cost of a new batch is the records written since it was submitted, not the topic
since the oldest unfinished batch (which was re-read in full for every new batch before).
A reader dropped after a Kafka error is reopened where it stopped.

Each tracked batch's new answers are appended to its answer log
(:mod:`batchpipe.api.answerlog`) in the order read, flushed at the end of every read: the
order that partial reads and the final files share.
"""

from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Message, TopicPartition

from batchpipe.api.answerlog import AnswerLog
from batchpipe.api.costcap import Cap
from batchpipe.api.records import BatchRecord
from batchpipe.collect import (
    CLOCK_SKEW_S,
    BatchTally,
    batch_time,
    open_reader,
    record_headers,
    records,
    start_offsets,
)
from worker.config import Config
from worker.errors import RequestError
from worker.wire.codec import CodecLimits, decode_result

_READ_S = 0.2  # longest one step spends reading results
_MARK_EVERY_S = 30.0  # how often the reader notes where it stands
_MARKS = 2_880  # a day of marks


def _since(batches: list[BatchRecord]) -> float | None:
    """The earliest submit time of ``batches``; None (from the start) if one has none."""
    starts = [batch_time(b.id) for b in batches]
    return None if None in starts else min(s for s in starts if s is not None)


class ResultsFollower:
    def __init__(
        self,
        config: Config,
        answers: Path,
        *,
        clock_skew_s: float = CLOCK_SKEW_S,
        mark_every_s: float = _MARK_EVERY_S,
    ) -> None:
        self._kafka = config.kafka
        self._clock_skew_s = clock_skew_s  # between this replica's clock and the others'
        self._mark_every_s = mark_every_s
        self._codec_limits = CodecLimits.from_config(config.limits)
        self._answers = answers  # the answer logs' directory
        self._logs: dict[str, AnswerLog] = {}
        self._caps: dict[str, Cap] = {}  # of the running batches that have one
        self._lock = threading.Lock()  # register() runs on request threads
        self._reader: Consumer | None = None
        self._partitions: list[int] = []
        self._next: dict[int, int] = {}  # per partition, the offset the reader reads next
        # (wall time, _next then): every record appended after that time lies at or after
        self._mark_times: list[float] = []
        self._marks: list[dict[int, int]] = []
        self.records_read = 0  # how many records the reader has read, for measurements

    def tally(self, batch_id: str) -> BatchTally | None:
        log = self._log(batch_id)
        return None if log is None else log.tally

    def _log(self, batch_id: str) -> AnswerLog | None:
        with self._lock:
            return self._logs.get(batch_id)

    def _open(self, batch: BatchRecord) -> AnswerLog:
        """The batch's answer log, opened if it is not (under ``_lock``)."""
        log = self._logs.get(batch.id)
        if log is None:
            log = self._logs[batch.id] = AnswerLog(self._answers, batch.id, batch.counts.total)
        return log

    def register(self, batch: BatchRecord) -> None:
        """Count ``batch`` from the reader's position on: its requests are not out yet."""
        with self._lock:
            self._open(batch)

    def answers(self, batch: BatchRecord) -> AnswerLog:
        """The batch's answer log, for its assembly on the follower's thread."""
        with self._lock:
            return self._open(batch)

    def follow(self, active: list[BatchRecord]) -> bool:
        """Count the results of ``active`` for at most ``_READ_S``; forget the others.

        True when the read stopped early at an answer that completed a batch (or took a
        batch to its cap: it is stopped in this step, not one poll interval later), so that the
        batch ends now rather than after the rest of the window (other batches' answers
        keep streaming in: the window was spent in full on every step, and a small batch
        waited for it behind a large one); the caller reads on without waiting. Before it
        returns, it counts what the reader has already fetched, without waiting, so that a
        burst of batches completing together ends in one pass, not a pass each."""
        ids = {b.id for b in active}
        self._caps = {
            b.id: b.cap
            for b in active
            if b.cap is not None and b.cap.limits and b.status in ("validating", "in_progress")
        }
        with self._lock:
            for gone in set(self._logs) - ids:
                self._logs.pop(gone).flush()
            new = [b for b in active if b.id not in self._logs]
            for batch in new:
                self._open(batch)
            tracked = [b for b in active if b.id in self._logs]
        if not tracked:
            return False
        if self._reader is None and not self._reopen():
            self._step_back(_since(tracked))  # a fresh reader: from the oldest batch
        elif new:
            self._step_back(_since(new))
        reader = self._reader
        assert reader is not None
        deadline = time.monotonic() + _READ_S
        completed = False
        for msg in records(reader, len(self._partitions), until_end=False, deadline=deadline):
            if self._count(msg):
                completed = True
                break
        while completed and time.monotonic() < deadline:
            fetched = reader.poll(0)
            if fetched is None:
                break
            if fetched.error() is None:  # a partition's end, or a transient error: read on
                self._count(fetched)
        self._mark()
        with self._lock:
            logs = list(self._logs.values())
        for log in logs:  # what partial reads may serve: whole lines, in the order read
            log.flush()
        return completed

    def _count(self, msg: Message) -> bool:
        """Count one record; True when its answer completed a tracked batch or took it
        to its cap."""
        self._next[msg.partition() or 0] = (msg.offset() or 0) + 1
        self.records_read += 1
        try:
            result = decode_result(msg.value(), record_headers(msg), self._codec_limits)
        except RequestError:
            return False
        log = self._log(result.batch_id)
        if log is None or not log.add(result):
            return False
        cap = self._caps.get(result.batch_id)
        return log.tally.complete or (cap is not None and cap.reached(log.tally) is not None)

    def _mark(self) -> None:
        now = time.time()
        if self._mark_times and now - self._mark_times[-1] < self._mark_every_s:
            return
        self._mark_times.append(now)
        self._marks.append(dict(self._next))
        if len(self._marks) > _MARKS:
            del self._mark_times[0], self._marks[0]

    def _mark_before(self, at: float) -> dict[int, int]:
        """Where the reader stood at the last mark at or before ``at`` ({} if none)."""
        index = bisect.bisect_right(self._mark_times, at)
        return self._marks[index - 1] if index else {}

    def _reopen(self) -> bool:
        """Open the reader; True when it goes on where the last one stopped (after a
        Kafka error), False when it is fresh and must be placed."""
        topic = self._kafka.results_topic
        consumer, count = open_reader(self._kafka, topic, None)
        self._reader = consumer
        self._partitions = list(range(count))
        if self._next and set(self._partitions) <= set(self._next):
            consumer.assign([TopicPartition(topic, p, self._next[p]) for p in self._partitions])
            return True
        self._next = {}
        self._mark_times, self._marks = [], []
        return False

    def _step_back(self, since: float | None) -> None:
        """Read again from ``since`` on, where that is before the reader's position."""
        assert self._reader is not None
        topic = self._kafka.results_topic
        starts = start_offsets(self._reader, topic, self._partitions, since)
        mark = {} if since is None else self._mark_before(since - self._clock_skew_s)
        for start in starts:
            start.offset = max(start.offset, mark.get(start.partition, start.offset))
            at = self._next.get(start.partition)
            if at is not None and at < start.offset:
                start.offset = at
            self._next[start.partition] = start.offset
        self._reader.assign(starts)

    def close(self) -> None:
        """Drop the reader (after a Kafka error); the next :meth:`follow` opens one where
        this one stopped, with the counts so far."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def stop(self) -> None:
        """Drop the reader and append what the answer logs hold: the server stops."""
        self.close()
        with self._lock:
            logs, self._logs = list(self._logs.values()), {}
        for log in logs:
            log.flush()
