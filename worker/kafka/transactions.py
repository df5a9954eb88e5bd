"""publish → commit under ``exactly_once``: one transaction per commit, one producer per worker.

Answers and the consumer offsets that cover them are written in one Kafka transaction
(``send_offsets_to_transaction`` with the consumer's group metadata, KIP-447): a crash
before the commit leaves neither, after it both. ``send`` only checks a record's size and
keeps it (:class:`~worker.kafka.answers.AnswerBuffer`), on the loop thread; the next
handover takes every answer waiting, whatever is still unanswered ahead of it, with a
progress record for each input partition it moves or answers and the pointers to them
(:mod:`worker.kafka.progress`), so the next owner of a partition skips what is answered
above its committed offset. A revoke drops the answers still waiting (the next owner
answers them). The committer thread (:mod:`worker.kafka.committer`) makes every
transactional call, so the loop goes on forming and running batches while a commit runs.
Every transaction sends offsets — the committed ones again when nothing moved — so the
broker checks the group generation on every commit (KIP-447).

The worker's slot is the lowest input partition it owns: ``transactional.id`` =
``<prefix>.<topic>.<partition>``, unique among the members of a generation of the group.
On each assignment the worker also calls ``init_transactions`` on the id of every other
partition it was given (:func:`_reclaim`): that fences whoever used one of those ids in an
earlier generation — a zombie cannot commit — and aborts the transaction it left open, at
once rather than after ``transaction.timeout.ms`` on Apache Kafka, or never on brokers
that do not time transactions out (Tansu). Every partition has an owner after a
rebalance, so a worker that dies for good has its transaction aborted by the next one.

On a broker that completes a transaction only once every transaction overlapping it on a
results partition has ended (Tansu, ``txn_end`` in its ``dynostore.rs``), the last
transaction of a worker that falls idle can wait on another worker's for good. It is
completed by its producer's next transaction once the overlapping ones have ended, which
the worker cannot see; so a worker that committed answers and then has none to commit
*settles*: it ends offsets-only transactions, holding only the offsets it already
committed (a no-op on Apache Kafka), at once and then after :data:`SETTLE_FIRST_S`
doubling to :data:`SETTLE_MAX_GAP_S` (:data:`SETTLE_SLOW_GAP_S` once it has settled for
:data:`SETTLE_WINDOW_S`), until the broker says that no partition of the topics it wrote
is held back (:mod:`worker.kafka.stable`, asked beside each settling transaction). A
fixed window was not enough: under other workers' load their transactions chain for
longer than any window, and an answer left behind was invisible for good. Before the
worker gives its producer up (it loses its last partition, changes its id or stops) it
settles for up to :data:`SETTLE_CLOSE_S` more, waiting on each transaction: once its id
is claimed by the next owner (a new epoch), only a later transaction on the same
partitions could complete what it left.

A transaction aborted for good (:class:`TransactionAborted`, after the committer's replays)
marks the partitions whose answers it held: their answers waiting for the next handover are
dropped, no offset of theirs is committed, and answers to them are not kept, until the loop
has rewound them (:meth:`TransactionalPublisher.forget`). A lost generation
(:class:`GenerationLost`: fenced, or refused by generation) drops the producer and every
partition at once; the loop rejoins the group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from confluent_kafka import TopicPartition

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.kafka.answers import AnswerBuffer, BufferLimits
from worker.kafka.committer import Committer, Handover
from worker.kafka.consumer import KafkaConsumer
from worker.kafka.failures import (
    FatalKafkaError,
    GenerationLost,
    MessageTooLarge,
    TransactionAborted,
)
from worker.kafka.outcome import TxOutcome
from worker.kafka.produce import Headers, ProducerFactory, RecordLimits, record_size
from worker.kafka.progress import ProgressLog, ProgressRecord, record, resume
from worker.kafka.publisher import OnAnswered, Outgoing, Publisher
from worker.kafka.reclaim import Reclaimer
from worker.kafka.stable import Answer, StableCheck

log = logging.getLogger(__name__)

#: settling (module doc): the first gap between offsets-only transactions, the longest, the
#: gap once it has gone on for the window, and the most it adds to giving a producer up
SETTLE_FIRST_S = 0.1
SETTLE_MAX_GAP_S = 2.0
SETTLE_SLOW_GAP_S = 10.0
SETTLE_WINDOW_S = 30.0
SETTLE_CLOSE_S = 3.0
#: the most librdkafka adds to a record's key, value and header bytes when it checks
#: ``message.max.bytes``: a record v2's varints (length, attributes, timestamp and offset
#: deltas, key and value lengths, header count) ...
_RECORD_FRAMING = 36
#: ... and two length varints per header
_HEADER_FRAMING = 10


class TransactionalPublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        producers: ProducerFactory,
        prefix: str,
        stable: StableCheck,
        on_outcome: Callable[[TxOutcome], None] = lambda outcome: None,
        progress: ProgressLog | None = None,
    ) -> None:
        """``stable``: whether the topics written are held back (settling, module doc).
        ``progress``: where progress records go and are read back from; None writes
        none (a partition's next owner then repeats the answers above its committed
        offset: for tests of the commit path alone)."""
        super().__init__(kafka, consumer, tracker)
        self._progress = progress
        self._producers = producers
        self._limits = RecordLimits(producers)
        self._prefix = prefix
        self._on_outcome = on_outcome  # for the transactions metric
        self._owned: set[Partition] = set()
        self._committer: Committer | None = None
        self._buffer = AnswerBuffer(
            BufferLimits(kafka.max_buffered_answers, kafka.max_buffered_bytes)
        )
        self._handed: Handover | None = None  # the handover in flight
        self._aborted: set[Partition] = set()  # aborted for good, not rewound yet
        self._reclaimer = Reclaimer(producers)
        # settling (module doc): when the next offsets-only transaction is due and the gap
        # after it; None: settled. Since when, and the topics written since then
        self._settle: tuple[float, float] | None = None
        self._settle_since = 0.0
        self._written: set[str] = set()
        self._warned = False  # held for the window: said once per settling
        self._stable = stable

    # -- the loop's side ---------------------------------------------------------------

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
        offset: int | None = None,
        on_taken: OnAnswered | None = None,
    ) -> None:
        if origin not in self._owned:
            raise RuntimeError(f"answer for {origin}, which this worker does not own")
        if origin in self._aborted:
            return  # its record is consumed again after the rewind, and answered then
        limit = self._limits(topic)
        size = record_size(key, value, headers)  # once: the committer does not count again
        if size + _RECORD_FRAMING + _HEADER_FRAMING * len(headers) > limit.bytes:
            raise MessageTooLarge(topic, size, limit)
        self._buffer.add(origin, size, Outgoing(topic, key, value, tuple(headers)))
        # the record counts as answered here: its offset may advance, and the next
        # handover's progress record counts it; the commit makes the answer, the offsets
        # and the progress visible together, an abort undoes them all
        on_answered()

    def full(self) -> bool:
        return self._buffer.full()

    def poll(self) -> None:
        """Take the outcome of a commit that has ended (:class:`TransactionAborted`,
        :class:`FatalKafkaError`)."""
        if self._committer is not None and self._committer.pending and not self._committer.busy:
            self._finish()

    def _commit_due(self) -> bool:
        if self._committer is None:
            return True
        if self._committer.busy:
            return False  # what is answered meanwhile goes into the next transaction
        self._finish()
        self._hand()
        return True

    def commit(self) -> None:
        """Commit now what is answered, and wait for it."""
        if self._committer is None:
            return
        self._finish()
        self._hand()
        self._finish()

    def forget(self, partitions: Collection[Partition]) -> None:
        gone = set(partitions)
        self._aborted -= gone
        self._buffer.forget(gone)

    def resume(self, partitions: Collection[Partition], timeout_s: float) -> list[TopicPartition]:
        """The committed offsets, and what earlier owners answered above them handed to
        the tracker (:func:`worker.kafka.progress.resume`)."""
        if self._progress is None:
            return super().resume(partitions, timeout_s)
        group = self._kafka.group_id
        return resume(self._consumer, self._progress, group, self._tracker, partitions, timeout_s)

    # -- rebalances --------------------------------------------------------------------

    def assign(self, partitions: Collection[Partition]) -> None:
        gained = set(partitions) - self._owned
        if not gained:
            return
        self._owned |= gained
        topic, number = min(self._owned)
        txn_id = f"{self._prefix}.{topic}.{number}"
        if self._committer is not None and self._committer.transactional_id != txn_id:
            self.commit()  # what the old id holds, before it changes (a lower partition)
            self._settle_out()
            self._close(flush=True)
        ids = [self._id(partition) for partition in sorted(gained)]
        self._reclaimer.claim([i for i in ids if i != txn_id])
        if self._committer is None:
            self._committer = Committer(self._producers(txn_id), txn_id, self._outcome)

    def revoke(self, partitions: Collection[Partition]) -> None:
        """Wait for the commit in flight, commit what is answered, hand ``partitions`` over
        (settling first when they are the last: module doc)."""
        try:
            self.commit()
            if self._owned <= set(partitions):
                self._settle_out()
        finally:
            self._release(partitions, flush=True)

    def lost(self, partitions: Collection[Partition]) -> None:
        """Commit nothing more for ``partitions``; their new owner may have fenced this
        worker's producer already, so a commit in flight that fails is dropped quietly.
        (Assignment is eager: a loss takes every partition.)"""
        try:
            if self._committer is not None:
                self._finish()
        except (TransactionAborted, FatalKafkaError, GenerationLost) as exc:
            log.info("lost %s: the commit in flight failed (%s)", sorted(partitions), exc)
            self._release(partitions, flush=False)
            return
        self._release(partitions, flush=True)

    def close(self) -> None:
        try:
            self.commit()
            self._settle_out()
        finally:
            self._release(list(self._owned), flush=True)
            self._stable.close()

    # -- helpers -----------------------------------------------------------------------

    def _hand(self) -> None:
        """Hand the committer every answer waiting, the offsets that moved and a progress
        record for each partition either touches, with that partition's offset (equal to
        the record's: a reader trusts a record only beside it); or, when nothing moved
        after a transaction that held answers, the offsets already committed (module doc).
        Every handover carries offsets: the generation check (KIP-447)."""
        assert self._committer is not None
        moved = [tp for tp in self._committable() if (tp.topic, tp.partition) not in self._aborted]
        records = self._buffer.take()
        if not records and not moved and not self._settle_due():
            return
        origins = frozenset(origin for origin, _ in records)
        progress = self._progress_records(origins | {(t.topic, t.partition) for t in moved})
        at = {(t.topic, t.partition): t.offset for t in moved}
        at.update((r.origin, r.committed) for r in progress)
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(at.items())]
        offsets = offsets or self._committed_offsets()
        if not offsets and not records:
            return
        handover = Handover(
            records=tuple(r for _, r in records),
            origins=origins,
            offsets=tuple(offsets),
            metadata=self._consumer.consumer_group_metadata(),
            progress=progress,
            progress_topic=self._progress.topic if self._progress is not None else "",
        )
        self._handed = handover
        self._committer.hand(handover)

    def _finish(self) -> None:
        """Wait for the handover in flight and take its outcome."""
        assert self._committer is not None
        handover, self._handed = self._handed, None
        try:
            self._committer.outcome()
        except TransactionAborted as exc:
            self._aborted.update(exc.partitions)
            self._buffer.forget(self._aborted)
            raise
        except GenerationLost:
            self.drop()
            raise
        if handover is not None:
            if handover.records:
                self._settle_since = time.monotonic()
                self._settle = (self._settle_since, SETTLE_FIRST_S)
                self._written.update(r.topic for r in handover.records)
                if handover.progress:
                    self._written.add(handover.progress_topic)
                self._warned = False
            self._mark(handover.offsets)

    def _progress_records(self, partitions: Collection[Partition]) -> tuple[ProgressRecord, ...]:
        """What the tracker says now of each of ``partitions``: every answer it counts is
        in this handover or in a transaction committed before it."""
        if self._progress is None:
            return ()
        group, count = self._kafka.group_id, self._progress.partitions
        found = []
        for origin in sorted(partitions):
            progress = self._tracker.progress(origin)
            if progress is not None and origin[1] < count:
                found.append(record(group, origin, progress))
        return tuple(found)

    def _settle_due(self) -> bool:
        """Whether an offsets-only transaction is due now (module doc); if so, the next
        one is scheduled and the broker asked whether anything is still held."""
        if self._settle is None:
            return False
        due, gap = self._settle
        now = time.monotonic()
        if now < due:
            return False
        if self._settled(self._stable.answer()):
            return False
        if now - self._settle_since >= SETTLE_WINDOW_S:
            gap = SETTLE_SLOW_GAP_S
        self._settle = (now + gap, min(2 * gap, SETTLE_MAX_GAP_S))
        self._stable.ask(self._written)
        return True

    def _settled(self, answer: Answer | None) -> bool:
        """Whether ``answer`` ends settling: asked after the last transaction with
        answers, it finds nothing held."""
        if answer is None or answer.asked < self._settle_since:
            return False
        if answer.held:
            if answer.asked - self._settle_since >= SETTLE_WINDOW_S and not self._warned:
                self._warned = True
                log.warning(
                    "read_committed readers held back on %s for %.0f s after this worker's "
                    "last answers: a transaction the broker has not completed",
                    sorted(answer.held),
                    answer.asked - self._settle_since,
                )
            return False
        self._settle = None
        self._written.clear()
        return True

    def _settle_out(self) -> None:
        """Before the producer is given up: settle, waiting on each transaction and each
        answer, until nothing is held or :data:`SETTLE_CLOSE_S` has passed."""
        deadline = time.monotonic() + SETTLE_CLOSE_S
        gap = SETTLE_FIRST_S
        while self._settle is not None and self._committer is not None:
            offsets = self._committed_offsets()
            if not offsets:
                return
            metadata = self._consumer.consumer_group_metadata()
            self._handed = Handover((), frozenset(), tuple(offsets), metadata)
            self._committer.hand(self._handed)
            self._finish()
            self._stable.ask(self._written)
            if self._settled(self._stable.wait(max(0.0, deadline - time.monotonic()))):
                return
            if time.monotonic() + gap >= deadline:
                log.info("gave the producer up with %s held back", sorted(self._written))
                return
            time.sleep(gap)
            gap = min(2 * gap, SETTLE_MAX_GAP_S)

    def _committed_offsets(self) -> list[TopicPartition]:
        found = []
        for topic, number in sorted(self._owned):
            offset = self._tracker.committed((topic, number))
            if offset is not None:
                found.append(TopicPartition(topic, number, offset))
        return found

    def _outcome(self, outcome: TxOutcome) -> None:  # on the committer thread
        if outcome == "commit":
            self.commits += 1
        else:
            self.aborts += 1
        self._on_outcome(outcome)

    def drop(self) -> None:
        """The generation is lost: the producer goes (unflushed; its successor aborted or
        aborts what it left open), and with it every partition and every answer held."""
        self._buffer.forget(self._owned)
        self._reclaimer.release([self._id(p) for p in self._owned])
        self._aborted.clear()
        self._owned.clear()
        self._settle = None
        self._close(flush=False)

    def _id(self, partition: Partition) -> str:
        return f"{self._prefix}.{partition[0]}.{partition[1]}"

    def _release(self, partitions: Collection[Partition], flush: bool) -> None:
        self.forget(partitions)
        self._reclaimer.release([self._id(p) for p in partitions])
        self._owned -= set(partitions)
        if not self._owned:
            self._close(flush)
            self._settle = None

    def _close(self, flush: bool) -> None:
        if self._committer is not None:
            self._committer.close(flush)
            self._committer = None
            self._handed = None
