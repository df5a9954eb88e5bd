"""publish → commit under ``exactly_once``: one Kafka transaction per input partition.

The results answering records of an input partition, and that partition's consumer
offsets, are written in one transaction, committed every ``commit_interval_ms``. A crash
before the commit leaves neither; after it, both. Each assigned input partition has its own
transactional producer, ``transactional.id`` = ``<prefix>.<topic>.<partition>``: whoever
owns a partition next fences the previous owner (a zombie cannot commit) and aborts the
transaction it left open at once — rather than after ``transaction.timeout.ms`` on Apache
Kafka, or never on brokers that do not time transactions out (Tansu), while that open
transaction holds back every read_committed reader of the results topic. Offsets never
pass an unanswered request (:class:`batcher.OffsetTracker`), so results that complete out
of order beyond a slower request may be produced again after a crash: readers join on
``custom_id`` (``collect`` keeps one line per id).

A transaction that ended while another of this worker's was still open is *unsettled*:
brokers like the embedded Tansu (``txn_end`` in its ``dynostore.rs``) complete an ended
transaction only once every transaction that overlaps it on a results partition has ended
too, and leave it PrepareCommit otherwise — holding back read_committed readers of that
partition — until a later transaction over the same partitions ends, or its own producer
ends another one. A producer whose last transaction is unsettled and that falls idle
would keep those results invisible for good, so once every open transaction of the round
has ended, each such producer ends one more, offsets-only, transaction
(:meth:`_Transactions.settle`) that re-commits the offset it already committed. On Apache
Kafka that is a no-op; busy producers never need it (their next transaction settles
them), so it costs nothing under load. Revoking and closing settle at once.

Failures (:mod:`worker.kafka.failures`): a transaction that must be aborted is aborted and
done again — its records produced anew in a new transaction, nothing lost, and the aborted
copies invisible to read_committed readers — up to :data:`REPLAYS` times; then it stays
aborted and its partition's records are consumed again (:class:`TransactionAborted`).
Retriable errors are retried; a fatal error or a fenced producer ends the worker, except
for a partition already lost, whose producer is dropped quietly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from functools import partial

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.kafka.consumer import KafkaConsumer
from worker.kafka.failures import (
    Abortable,
    TransactionAborted,
    call,
    produce_checked,
)
from worker.kafka.produce import Headers, ProducerFactory, RecordLimits
from worker.kafka.publisher import TIMEOUT_S, OnAnswered, Outgoing, Publisher
from worker.obs.metrics import TxOutcome

log = logging.getLogger(__name__)

#: new transactions that redo an aborted one before its partition's records are read again
REPLAYS = 3
#: how long the abort of a lost partition's transaction may take, inside the rebalance
LOST_ABORT_S = 5.0


class _Transactions:
    """One transactional producer, and the records of its open transaction."""

    def __init__(self, producers: ProducerFactory, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.limit = RecordLimits(producers)
        self.producer = producers(transactional_id)
        self.open = False
        self.records: list[Outgoing] = []  # produced in the open transaction, for a replay
        #: the last transaction ended while another of this worker's was open (module doc)
        self.unsettled = False
        self.committed: TopicPartition | None = None  # the offset the last commit sent
        call(self.producer.init_transactions, TIMEOUT_S)

    def produce(self, record: Outgoing) -> None:
        self._begin()
        r = record
        produce_checked(
            self.producer,
            self.limit(r.topic),
            r.topic,
            r.key,
            r.value,
            r.headers,
            _log_delivery_error,
        )
        self.records.append(record)

    def commit(self, offsets: list[TopicPartition], consumer: KafkaConsumer) -> None:
        self._begin()
        if offsets:
            metadata = consumer.consumer_group_metadata()
            call(self.producer.send_offsets_to_transaction, offsets, metadata, TIMEOUT_S)
        call(self.producer.commit_transaction, TIMEOUT_S)
        self.open = False
        self.records.clear()
        if offsets:
            self.committed = offsets[-1]

    def settle(self, offset: TopicPartition, consumer: KafkaConsumer) -> None:
        """End one more transaction, holding only ``offset`` (already committed), so that
        the broker completes the last one (module doc). An abortable failure aborts it —
        nothing is lost — and leaves the producer unsettled, to try again next round."""
        self._begin()
        metadata = consumer.consumer_group_metadata()
        call(self.producer.send_offsets_to_transaction, [offset], metadata, TIMEOUT_S)
        call(self.producer.commit_transaction, TIMEOUT_S)
        self.open = False
        self.unsettled = False

    def abort(self) -> None:
        """Abort the open transaction; its records stay for :meth:`replay`."""
        self.open = False
        call(self.producer.abort_transaction, TIMEOUT_S)

    def replay(self) -> None:
        """Produce the aborted transaction's records again, in a new transaction."""
        records, self.records = self.records, []
        try:
            for record in records:
                self.produce(record)
        except BaseException:
            self.records = records  # every one of them, for the next attempt
            raise

    def _begin(self) -> None:
        if not self.open:
            call(self.producer.begin_transaction)
            self.open = True


class TransactionalPublisher(Publisher):
    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        producers: ProducerFactory,
        prefix: str,
        on_outcome: Callable[[TxOutcome], None] = lambda outcome: None,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._producers = producers
        self._prefix = prefix
        self._on_outcome = on_outcome  # for the transactions metric
        self._owned: dict[Partition, _Transactions] = {}

    def assign(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            if partition not in self._owned:
                topic, number = partition
                txn_id = f"{self._prefix}.{topic}.{number}"
                self._owned[partition] = _Transactions(self._producers, txn_id)

    def send(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes,
        headers: Headers,
        origin: Partition,
        on_answered: OnAnswered,
    ) -> None:
        txn = self._owned.get(origin)
        if txn is None:
            raise RuntimeError(f"answer for {origin}, which this worker does not own")
        record = Outgoing(topic, key, value, tuple(headers))
        self._done_once(origin, txn, lambda: txn.produce(record))
        # inside a transaction a result counts as given once produced: the commit makes
        # it and its offset visible together, an abort undoes both
        on_answered()

    def poll(self) -> None:
        for txn in self._owned.values():
            txn.producer.poll(0)

    def commit(self, settle: Collection[Partition] = ()) -> None:
        """Commit every open transaction; then settle the producers that fell idle
        unsettled, and those of ``settle`` (about to be handed over) whatever they did."""
        aborted: list[Partition] = []
        reasons: list[str] = []
        ended: set[Partition] = set()
        for partition, txn in list(self._owned.items()):
            if not txn.open:
                continue
            ended.add(partition)
            offsets = self._committable([partition])
            try:
                self._done_once(partition, txn, partial(txn.commit, offsets, self._consumer))
            except TransactionAborted as exc:
                aborted.append(partition)
                reasons.append(str(exc))
                continue
            finally:
                txn.unsettled = self._any_open()
            self._committed()
            self._mark(offsets)
        self._settle([p for p in self._owned if p not in ended or p in settle])
        if aborted:
            raise TransactionAborted(aborted, "; ".join(reasons))

    def revoke(self, partitions: Collection[Partition]) -> None:
        # every open transaction ends now, not only those of ``partitions``: one of theirs
        # ending while another of this worker's stays open could not be settled
        try:
            self.commit(settle=partitions)
        finally:
            self._release(partitions)

    def lost(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            txn = self._owned.pop(partition, None)
            if txn is None:
                continue
            if txn.open:
                self._aborted()
                try:  # once, briefly: the partition's new owner aborts it anyway
                    txn.producer.abort_transaction(LOST_ABORT_S)
                except KafkaException as exc:
                    # fenced by the new owner (a broker may not even answer a fenced
                    # producer: a timeout); the producer is dropped, and a later assignment
                    # of the partition builds a new one
                    log.info("lost %s: abort failed (%s); its producer is dropped", partition, exc)
                    continue
            txn.producer.flush(TIMEOUT_S)

    def close(self) -> None:
        try:
            self.commit(settle=list(self._owned))
        finally:
            self._release(list(self._owned))

    def _done_once(
        self, partition: Partition, txn: _Transactions, step: Callable[[], None]
    ) -> None:
        """Run ``step`` in ``txn``'s transaction; when that transaction must be aborted,
        abort it, redo it in a new one and run ``step`` again, up to :data:`REPLAYS` times.
        Then it stays aborted: :class:`TransactionAborted` for ``partition``."""
        reason = ""
        for attempt in range(REPLAYS + 1):
            try:
                if attempt:
                    txn.replay()
                step()
                return
            except Abortable as exc:
                reason = str(exc)
                log.warning("aborting the transaction of %s: %s", txn.transactional_id, reason)
                self._aborted()
                txn.abort()
        txn.records.clear()
        raise TransactionAborted([partition], f"{reason} ({REPLAYS} replays failed too)")

    def _settle(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            txn = self._owned[partition]
            if not txn.unsettled:
                continue
            offset = txn.committed or self._committed_offset(partition)
            if offset is None:
                continue  # not read since a rewind: the next transaction settles it
            try:
                txn.settle(offset, self._consumer)
            except Abortable as exc:
                log.warning("aborting the closing transaction of %s: %s", partition, exc)
                self._aborted()
                txn.abort()
                continue
            self._committed()

    def _committed_offset(self, partition: Partition) -> TopicPartition | None:
        offset = self._tracker.committed(partition)
        return None if offset is None else TopicPartition(partition[0], partition[1], offset)

    def _any_open(self) -> bool:
        return any(txn.open for txn in self._owned.values())

    def _committed(self) -> None:
        self.commits += 1
        self._on_outcome("commit")

    def _aborted(self) -> None:
        self.aborts += 1
        self._on_outcome("abort")

    def _release(self, partitions: Collection[Partition]) -> None:
        for partition in partitions:
            txn = self._owned.pop(partition, None)
            if txn is not None:
                txn.producer.flush(TIMEOUT_S)


def _log_delivery_error(err: KafkaError | None, _msg: Message) -> None:
    # errors inside a transaction surface again, and decide its fate, at commit_transaction
    if err is not None:
        log.warning("transactional delivery failed: %s", err)
