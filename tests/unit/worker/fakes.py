"""In-memory Kafka and a gated engine, to drive the worker loop without a broker.

* :class:`FakeBroker` — the requests topic's partition logs, the group's committed offsets
  and every record published.
* :class:`FakeConsumer` — librdkafka's consumer as the worker sees it. Rebalances are
  queued by the test and served one per ``poll``/``consume`` call, callbacks first, as
  librdkafka serves them; ``close`` revokes the assignment through ``on_revoke`` too. An
  assigned partition is read from its committed offset (else from the broker's earliest
  offset, ``auto.offset.reset: earliest``), so records not committed before a revoke are
  read again; ``assign`` inside ``on_assign`` replaces that default, as in
  confluent-kafka. Pause is a flag of the partition, not of the assignment: it survives
  unassign and assign, as in librdkafka. ``returns_while_paused`` makes ``poll`` return a
  paused partition's records anyway, as a consumer may with records fetched before a pause.
  ``position`` is unknown until a record of the partition was returned; the cached high
  watermark is the partition's end as of its last fetch (none while paused); a partition
  in ``unreachable`` has no watermarks (the broker does not answer), and while
  ``coordinator_down`` the committed offsets cannot be read.
* :class:`FakePublisher` — the :class:`Publisher` contract in memory. An answer counts as
  given when it is sent (``on_answered`` runs inside ``send``), as inside a transaction;
  commits write the tracker's offsets to the broker through the consumer. Like the
  transactional publisher it refuses an answer for a partition it does not own, and like
  librdkafka a record over the producers' ``message.max.bytes``
  (:attr:`FakeBroker.max_message_bytes`) with :class:`MessageTooLarge`.
* :class:`FakeClients` — the worker's Kafka clients: the fake consumer, and the fake
  publisher or a real one (``delivery``) on :mod:`fake_producer`'s producers.
* :class:`GatedEngine` — the echo engine's answers, but ``run_batch`` waits until the test
  opens its gate, so a batch stays "on the engine" for as long as a test needs.
* :class:`GatedInFlightEngine` — the same for an in-flight engine: what is submitted runs
  until the test opens the gate (``stragglers`` run on until the test lets them go); it
  records every submit and abort, and can be made to break, or to report aborted requests
  anyway (an engine that breaks the contract).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from batcher import OffsetTracker, Partition
from worker.config import KafkaConfig
from worker.engines.base import (
    Capacity,
    Completion,
    EngineBroken,
    EngineInput,
    InFlightEngine,
    OnComplete,
    StaticEngine,
)
from worker.engines.echo import EchoEngine, echo_completion, encode_echo
from worker.kafka.consumer import KafkaConsumer, RebalanceCallback, RecordHeaders
from worker.kafka.factory import KafkaClients, OnOutcome
from worker.kafka.produce import Headers, record_limit, record_size
from worker.kafka.progress import progress_topic
from worker.kafka.publisher import AtLeastOncePublisher, MessageTooLarge, OnAnswered, Publisher
from worker.kafka.transactions import TransactionalPublisher
from worker.wire.codec import decode_result, encode_request
from worker.wire.messages import InferenceRequest, InferenceResult

from .fake_producer import FakeProducers
from .fake_stable import FakeStableCheck

RebalanceKind = Literal["assign", "revoke", "lost"]

#: the most a fake call blocks when it has nothing to return (librdkafka waits ``timeout``)
_IDLE_S = 0.002
#: how long a gated engine waits for its gate before it gives up on the test
_GATE_S = 30.0


@dataclass(frozen=True)
class FakeMessage:
    """A consumed record (the :class:`~worker.kafka.consumer.Record` surface)."""

    at: Partition
    position: int
    record_key: bytes | None
    record_value: bytes | None
    record_headers: RecordHeaders | None

    def topic(self) -> str | None:
        return self.at[0]

    def partition(self) -> int | None:
        return self.at[1]

    def offset(self) -> int | None:
        return self.position

    def key(self) -> bytes | None:
        return self.record_key

    def value(self) -> bytes | None:
        return self.record_value

    def headers(self) -> RecordHeaders | None:
        return self.record_headers

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)  # TIMESTAMP_NOT_AVAILABLE

    def error(self) -> KafkaError | None:
        return None


@dataclass(frozen=True)
class Sent:
    """One record a publisher produced."""

    topic: str
    key: bytes | str | None
    value: bytes
    headers: Headers
    origin: Partition | None = None  # the record it answers; None from a FakeProducer


class FakeBroker:
    """One requests topic with ``partitions`` partitions, one group, any output topics."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.logs: dict[Partition, list[FakeMessage]] = {(topic, p): [] for p in range(partitions)}
        self.committed: dict[Partition, int] = {}
        #: what the broker answers when asked for a partition's earliest offset, where it
        #: is not 0: a wrong answer, as the embedded Tansu broker's (FROM_START)
        self.earliest: dict[Partition, int] = {}
        self.sent: list[Sent] = []
        self.topics: set[str] = {topic}
        #: the producers' message.max.bytes (librdkafka's default)
        self.max_message_bytes = 1_000_000
        #: topics' max.message.bytes, where one is set (the broker does not enforce it)
        self.topic_max: dict[str, int] = {}
        #: delivery reports wait for a flush (fake_producer.py)
        self.deliveries_held = False
        #: every record a FakeProducer produced, committed, aborted or not
        self.raw: list[tuple[str, bytes | str | None, bytes | None, Headers]] = []
        #: the values of records produced to an explicit partition, at their offsets
        #: (committed, aborted or not): what the progress log reads back
        self.stored: dict[Partition, list[bytes | None]] = {}
        #: every committed transaction: transactional.id, records, offsets (topic, partition,
        #: offset) sent to it
        self.transactions: list[tuple[str, int, tuple[tuple[str, int, int], ...]]] = []
        self._faults: dict[str, deque[KafkaError]] = {}
        self._epochs: Counter[str] = Counter()
        self._gates: dict[str, threading.Event] = {}

    def gate(self, method: str) -> threading.Event:
        """Calls of a FakeProducer's ``method`` wait until the returned event is set."""
        return self._gates.setdefault(method, threading.Event())

    def pass_gate(self, method: str) -> None:
        gate = self._gates.get(method)
        if gate is not None and not gate.wait(_GATE_S):
            raise AssertionError(f"the test never opened the gate of {method}")

    def fail(self, method: str, error: KafkaError, times: int = 1) -> None:
        """The next ``times`` calls of a FakeProducer's ``method`` raise ``error`` (for
        ``"delivery"``: the next deliveries report it)."""
        self._faults.setdefault(method, deque()).extend([error] * times)

    def next_fault(self, method: str) -> KafkaError | None:
        queued = self._faults.get(method)
        return queued.popleft() if queued else None

    def fence(self, transactional_id: str) -> int:
        """A new producer epoch for ``transactional_id``: older producers are fenced."""
        self._epochs[transactional_id] += 1
        return self._epochs[transactional_id]

    def epoch(self, transactional_id: str) -> int:
        return self._epochs[transactional_id]

    def publish(
        self, topic: str, key: bytes | str | None, value: bytes | None, headers: Headers
    ) -> None:
        """A record becomes visible to (read_committed) readers."""
        self.sent.append(Sent(topic, key, value or b"", tuple(headers)))

    def submit(self, partition: int, custom_id: str, prompt: str, batch_id: str = "") -> None:
        """Append a request to the end of ``partition``."""
        self.submit_request(
            partition, InferenceRequest(custom_id=custom_id, prompt=prompt, batch_id=batch_id)
        )

    def submit_request(self, partition: int, request: InferenceRequest) -> None:
        value, headers = encode_request(request)
        self.append(partition, value, list(headers))

    def append(
        self, partition: int, value: bytes | None, headers: RecordHeaders | None = None
    ) -> None:
        """Append a raw record to the end of ``partition``."""
        log = self.logs[(self.topic, partition)]
        log.append(FakeMessage((self.topic, partition), len(log), None, value, headers))

    def on(self, topic: str) -> list[Sent]:
        """The records published to ``topic``."""
        return [s for s in self.sent if s.topic == topic]

    def results(self, topic: str) -> list[InferenceResult]:
        return [decode_result(s.value, list(s.headers)) for s in self.sent if s.topic == topic]

    def answers(self, topic: str) -> Counter[str]:
        """How many results each ``custom_id`` got on ``topic``."""
        return Counter(r.custom_id for r in self.results(topic))


class FakeConsumer:
    """A group member of :class:`FakeBroker`; see the module docstring for what it models."""

    def __init__(self, broker: FakeBroker) -> None:
        self._broker = broker
        self._callbacks: dict[RebalanceKind, RebalanceCallback | None] = {}
        self._rebalances: deque[tuple[RebalanceKind, list[Partition]]] = deque()
        self._positions: dict[Partition, int] = {}  # the assignment: next offset to read
        self._paused: set[Partition] = set()
        self.closed = False
        self.returns_while_paused = False
        self.unreachable: set[Partition] = set()
        self._read_to: dict[Partition, int] = {}  # the position: after the last record returned
        self._fetched_end: dict[Partition, int] = {}  # the end offset as of the last fetch
        self.calls = 0  # poll/consume calls that returned
        self.delivered = 0  # records returned by poll/consume
        self._assigning = False  # inside on_assign: assign() may set the offsets
        self.coordinator_down = False  # committed() times out
        self.unsubscribed = 0  # unsubscribe() calls: the worker left the group to rejoin it

    # -- what the test does ------------------------------------------------------------

    def rebalance(self, kind: RebalanceKind, partitions: Sequence[Partition]) -> None:
        """Queue a rebalance event; a later ``poll``/``consume`` serves it."""
        self._rebalances.append((kind, list(partitions)))

    @property
    def rebalancing(self) -> bool:
        """Rebalance events queued and not served yet."""
        return bool(self._rebalances)

    def paused(self) -> set[Partition]:
        """Assigned partitions that deliver nothing because they are paused."""
        return self._paused & self._positions.keys()

    # -- the consumer surface ----------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        assert topics == [self._broker.topic], f"subscribed to {topics}"
        # librdkafka falls back to on_revoke when no on_lost is given
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost or on_revoke}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        return self._read(num_messages, timeout, paused_too=False)

    def poll(self, timeout: float = -1) -> FakeMessage | None:
        messages = self._read(1, timeout, paused_too=self.returns_while_paused)
        return messages[0] if messages else None

    def assign(self, partitions: list[TopicPartition]) -> None:
        assert self._assigning, "assign() outside on_assign: the worker never does that"
        self._assigning = False
        for tp in partitions:
            at = (tp.topic, tp.partition)
            if tp.offset >= 0:
                self._positions[at] = tp.offset
            elif tp.offset == OFFSET_BEGINNING:
                self._positions[at] = self._earliest(at)
            else:
                self._positions[at] = self._default_start(at)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._paused.update(_pairs(partitions))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._paused.difference_update(_pairs(partitions))

    def assignment(self) -> list[TopicPartition]:
        return _tps(self._positions)

    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]:
        for tp in offsets:
            self._broker.committed[(tp.topic, tp.partition)] = tp.offset
        return offsets

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        if self.coordinator_down:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no group coordinator"))
        committed = self._broker.committed
        return [
            TopicPartition(
                tp.topic, tp.partition, committed.get((tp.topic, tp.partition), OFFSET_INVALID)
            )
            for tp in partitions
        ]

    def seek(self, partition: TopicPartition) -> None:
        at = (partition.topic, partition.partition)
        if at not in self._positions:
            raise KafkaException(KafkaError(KafkaError._STATE, f"{at} is not assigned"))
        beginning = partition.offset == OFFSET_BEGINNING
        self._positions[at] = self._earliest(at) if beginning else partition.offset
        self._read_to[at] = self._positions[at]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self._read_to.get(at, OFFSET_INVALID))
            for tp, at in zip(partitions, _pairs(partitions), strict=True)
        ]

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        at = (partition.topic, partition.partition)
        if at in self.unreachable:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{at}: no answer"))
        if cached:
            return (OFFSET_INVALID, self._fetched_end.get(at, OFFSET_INVALID))
        return (0, len(self._broker.logs[at]))

    def consumer_group_metadata(self) -> object:
        return "fake-group-metadata"

    def unsubscribe(self) -> None:
        """Leave the group: the assignment is revoked through ``on_revoke``; the test
        queues the assignment of the next generation."""
        self.unsubscribed += 1
        if self._positions:
            self._serve("revoke", list(self._positions))

    def close(self) -> None:
        """Leave the group: the assignment is revoked through ``on_revoke`` first."""
        if self._positions:
            self._serve("revoke", list(self._positions))
        self.closed = True

    def _read(self, num_messages: int, timeout: float, paused_too: bool) -> list[FakeMessage]:
        """Serve one queued rebalance, then read up to ``num_messages`` records."""
        self._check_open()
        if self._rebalances:
            self._serve(*self._rebalances.popleft())
        out: list[FakeMessage] = []
        for partition in list(self._positions):
            if partition not in self._paused:
                self._fetched_end[partition] = len(self._broker.logs[partition])
            if (partition in self._paused and not paused_too) or len(out) >= num_messages:
                continue
            start = self._positions[partition]
            taken = self._broker.logs[partition][start : start + num_messages - len(out)]
            self._positions[partition] = start + len(taken)
            if taken:
                self._read_to[partition] = self._positions[partition]
            out.extend(taken)
        if not out and timeout != 0:
            time.sleep(_IDLE_S)
        self.delivered += len(out)
        self.calls += 1
        return out

    def _serve(self, kind: RebalanceKind, partitions: list[Partition]) -> None:
        callback = self._callbacks.get(kind)
        if kind == "assign":  # the defaults; the callback may assign() offsets of its own
            for partition in partitions:
                self._positions[partition] = self._default_start(partition)
        self._assigning = kind == "assign"
        if callback is not None:
            callback(self, _tps(partitions))
        self._assigning = False
        for partition in partitions:
            self._read_to.pop(partition, None)
            self._fetched_end.pop(partition, None)
            if kind != "assign":  # confluent-kafka unassigns after the callback returns
                self._positions.pop(partition, None)

    def _default_start(self, partition: Partition) -> int:
        """Where an assignment without offsets starts: committed, else "earliest"."""
        return self._broker.committed.get(partition, self._earliest(partition))

    def _earliest(self, partition: Partition) -> int:
        return self._broker.earliest.get(partition, 0)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")


class FakePublisher(Publisher):
    """See the module docstring: answers count as given when sent."""

    def __init__(
        self,
        kafka: KafkaConfig,
        consumer: KafkaConsumer,
        tracker: OffsetTracker,
        broker: FakeBroker,
    ) -> None:
        super().__init__(kafka, consumer, tracker)
        self._broker = broker
        self._owned: set[Partition] = set()

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
        size = record_size(key, value, headers)
        limit = record_limit(self._broker.max_message_bytes, topic, self._broker.topic_max)
        if size > limit.bytes:
            raise MessageTooLarge(topic, size, limit)
        self._broker.sent.append(Sent(topic, key, value, tuple(headers), origin))
        on_answered()

    def commit(self) -> None:
        offsets = self._committable()
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)
            self._mark(offsets)
            self.commits += 1

    def poll(self) -> None:
        """Nothing to serve: a send is final at once."""

    def assign(self, partitions: Collection[Partition]) -> None:
        self._owned.update(partitions)

    def revoke(self, partitions: Collection[Partition]) -> None:
        self.commit()
        self._owned.difference_update(partitions)

    def lost(self, partitions: Collection[Partition]) -> None:
        self._owned.difference_update(partitions)

    def forget(self, partitions: Collection[Partition]) -> None:
        """Nothing waits here: a send is final at once."""

    def close(self) -> None:
        self.commit()


class FakeControl:
    """The control topic: values the test appends are read once, in order."""

    def __init__(self) -> None:
        self.values: deque[bytes] = deque()

    def read(self) -> list[bytes]:
        read = list(self.values)
        self.values.clear()
        return read

    def close(self) -> None:
        """Nothing to close."""


Delivery = Literal["fake", "exactly_once", "at_least_once"]


class FakeProgressLog:
    """The progress topic of :class:`FakeBroker`: one partition per requests partition."""

    def __init__(self, broker: FakeBroker, topic: str, partitions: int) -> None:
        self._broker = broker
        self._topic = topic
        self._partitions = partitions
        #: every read: the offsets asked for
        self.reads: list[dict[Partition, int]] = []

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partitions(self) -> int:
        return self._partitions

    def read(self, records: Mapping[Partition, int]) -> dict[Partition, bytes | None]:
        self.reads.append(dict(records))
        found: dict[Partition, bytes | None] = {}
        for origin, offset in records.items():
            stored = self._broker.stored.get((self._topic, origin[1]), [])
            if 0 <= offset < len(stored):
                found[origin] = stored[offset]
        return found


class FakeClients(KafkaClients):
    r"""Hands the worker :attr:`fake_consumer` and a publisher on ``broker``: a
    :class:`FakePublisher`, or the real publisher of a delivery mode on
    :class:`~tests.unit.worker.fake_producer.FakeProducer`\ s."""

    def __init__(self, kafka: KafkaConfig, broker: FakeBroker, delivery: Delivery = "fake") -> None:
        super().__init__(kafka)
        self.broker = broker
        self.fake_consumer = FakeConsumer(broker)
        self.fake_control = FakeControl()
        self.delivery = delivery

    def ensure_topics(self, topics: Sequence[str]) -> None:
        self.broker.topics.update(topics)

    def consumer(self) -> FakeConsumer:
        return self.fake_consumer

    def offsets(self) -> FakeConsumer:
        return self.fake_consumer  # one in-memory broker: nothing waits in line

    def publisher(
        self, consumer: KafkaConsumer, tracker: OffsetTracker, on_outcome: OnOutcome
    ) -> Publisher:
        producers = FakeProducers(self.broker)
        if self.delivery == "exactly_once":
            prefix = f"batchpipe.{self.kafka.group_id}"
            progress = FakeProgressLog(
                self.broker,
                progress_topic(self.kafka.requests_topic),
                sum(1 for t, _ in self.broker.logs if t == self.broker.topic),
            )
            stable = FakeStableCheck()
            return TransactionalPublisher(
                self.kafka, consumer, tracker, producers, prefix, stable, on_outcome, progress
            )
        if self.delivery == "at_least_once":
            return AtLeastOncePublisher(self.kafka, consumer, tracker, producers)
        return FakePublisher(self.kafka, consumer, tracker, self.broker)

    def control(self) -> FakeControl:
        return self.fake_control


class GatedEngine(StaticEngine):
    """Echo answers, released by the test; a batch holding ``poison`` raises."""

    def __init__(self, *, gated: bool = True, poison: str | None = None) -> None:
        self._echo = EchoEngine()
        self.model_name = self._echo.model_name
        self._gate = threading.Event()
        if not gated:
            self._gate.set()
        self._poison = poison
        self._lock = threading.Lock()
        self._batches: list[tuple[str, ...]] = []
        self.entered = threading.Event()  # set once the first batch reached the engine

    def open(self) -> None:
        """Let every batch, waiting or to come, run."""
        self._gate.set()

    @property
    def batches(self) -> list[tuple[str, ...]]:
        """The prompts of every ``run_batch`` call so far, in call order."""
        with self._lock:
            return list(self._batches)

    def load(self) -> None:
        """Nothing to load."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return self._echo.encode(request)

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        with self._lock:
            self._batches.append(tuple(_prompt(item) for item in inputs))
        self.entered.set()
        if not self._gate.wait(_GATE_S):
            raise TimeoutError("the test never opened the engine's gate")
        if any(_prompt(item) == self._poison for item in inputs):
            raise RuntimeError("poisoned batch")
        self._echo.run_batch(inputs, on_complete)

    def utilization(self) -> float:
        return self._echo.utilization()


class GatedInFlightEngine(InFlightEngine):
    """Echo answers for what was submitted, reported once the test opens the gate.

    Room for ``max_sequences`` at once. ``late_aborts``: aborted requests are still
    completed (breaking the contract, as a racing engine might). ``broken``: ``completions``
    raises, as from an engine whose scheduler died.
    """

    def __init__(
        self,
        *,
        gated: bool = True,
        max_sequences: int = 64,
        late_aborts: bool = False,
        broken: bool = False,
    ) -> None:
        self.model_name = "echo"
        self._gate = threading.Event()
        if not gated:
            self._gate.set()
        self._max_sequences = max_sequences
        self._late_aborts = late_aborts
        self._broken = broken
        self._lock = threading.Lock()
        self._running: dict[str, EngineInput] = {}
        self.submitted: list[str] = []  # every key submitted, in order
        self.aborted: list[str] = []  # every key aborted, in order
        #: prompts that do not complete, gate open or not, until the test removes them:
        #: long requests still decoding while shorter ones after them complete
        self.stragglers: set[str] = set()
        self.entered = threading.Event()  # set by the first submit
        #: what ``capacity`` says of flex-tier requests (a remote server under pressure)
        self.flex_open = True

    def open(self) -> None:
        """Let everything submitted, now or later, complete."""
        self._gate.set()

    @property
    def running(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def load(self) -> None:
        """Nothing to load."""

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return encode_echo(request)

    def submit(self, item: EngineInput) -> None:
        with self._lock:
            assert item.key not in self.submitted, f"key {item.key} submitted twice"
            self.submitted.append(item.key)
            self._running[item.key] = item
        self.entered.set()

    def abort(self, keys: Collection[str]) -> None:
        with self._lock:
            self.aborted.extend(keys)
            if not self._late_aborts:
                for key in keys:
                    self._running.pop(key, None)

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        if self._broken and self.submitted:
            raise EngineBroken("the scheduler died")
        if not self._gate.is_set():
            return []
        with self._lock:
            running = self._running.items()
            finished = [k for k, item in running if _prompt(item) not in self.stragglers]
            done = [echo_completion(self._running.pop(key)) for key in finished]
        return done

    def capacity(self) -> Capacity:
        with self._lock:
            free = max(0, self._max_sequences - len(self._running))
            return Capacity(free, 1 << 30, flex=self.flex_open)

    def utilization(self) -> float:
        return 0.0


def _prompt(item: EngineInput) -> str:
    return bytes(item.prompt_token_ids).decode()  # the echo engine's tokens are UTF-8 bytes


def _pairs(partitions: Sequence[TopicPartition]) -> list[Partition]:
    return [(tp.topic, tp.partition) for tp in partitions]


def _tps(partitions: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(topic, number) for topic, number in partitions]
