"""The API server in memory: its state topic on a :class:`FakeLog`, a local file store,
and a lifecycle that publishes and announces nothing — for TestClient tests of the ASGI
app and of the state topic's rules, no broker needed.

:class:`FakeLog` models what :class:`~batchpipe.api.state.StateTopic` relies on from the
one partition of the state topic: records appended in order at ``produce``, the verdict
served by ``poll``/``flush``; a scripted verdict (:meth:`FakeLog.fail_next`) may say
"failed" although the record was written (the acknowledgement lost); ``down`` makes
every call fail as an unreachable broker would; ``gate`` runs inside ``produce``, to hold
a write at a chosen moment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from fastapi.testclient import TestClient

from batchpipe.api.answerlog import answers_dir
from batchpipe.api.app import create_app
from batchpipe.api.auth import Keys
from batchpipe.api.context import Services, file_limits
from batchpipe.api.follow import ResultsFollower
from batchpipe.api.lifecycle import Lifecycle
from batchpipe.api.metrics import ApiMetrics
from batchpipe.api.records import BatchRecord, Counts, FileRecord, new_file_id
from batchpipe.api.state import StateClients, StateTopic
from batchpipe.api.store import LocalStore
from batchpipe.collect import new_batch_id
from worker.config import ApiConfig, Config
from worker.kafka.cancellations import Stop

KEYS = Keys({"sk-alice": "alice", "sk-bob": "bob"})
ALICE = {"Authorization": "Bearer sk-alice"}
#: one valid line of a batch file
LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
    b'"body": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}}\n'
)


@dataclass
class _Failure:
    error: KafkaError
    written: bool  # the record reached the log although the verdict says it failed


@dataclass
class FakeLog:
    records: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    down: bool = False
    gate: Callable[[str], None] | None = None
    failures: list[_Failure] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def fail_next(self, code: int, *, written: bool) -> None:
        self.failures.append(_Failure(KafkaError(code, "scripted"), written))

    def clients(self) -> StateClients:
        return StateClients(
            cast(Producer, FakeProducer(self)),
            cast(Consumer, FakeConsumer(self)),
            cast(Consumer, FakeProbe(self)),
        )

    def append(self, key: bytes, value: bytes | None) -> None:
        with self.changed:
            self.records.append((key, value))
            self.changed.notify_all()

    def latest(self) -> dict[str, bytes | None]:
        """What compaction keeps: the last record of each key."""
        with self.changed:
            return {k.decode(): v for k, v in self.records}


def _unreachable() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))


class FakeProducer:
    def __init__(self, log: FakeLog) -> None:
        self._log = log
        self._reports: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def produce(
        self, topic: str, key: bytes, value: bytes | None, on_delivery: Callable[..., None]
    ) -> None:
        if self._log.gate is not None:
            self._log.gate(key.decode())
        failure = self._log.failures.pop(0) if self._log.failures else None
        if self._log.down:
            failure = _Failure(KafkaError(KafkaError._MSG_TIMED_OUT, "broker down"), False)
        if failure is None or failure.written:
            self._log.append(key, value)
        error = None if failure is None else failure.error
        with self._lock:
            self._reports.append(lambda: on_delivery(error, None))

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            reports, self._reports = self._reports, []
        for report in reports:
            report()
        return len(reports)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


@dataclass
class FakeMessage:
    _key: bytes | None
    _value: bytes | None
    _offset: int
    _error: KafkaError | None = None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return 0

    def error(self) -> KafkaError | None:
        return self._error


class FakeConsumer:
    def __init__(self, log: FakeLog) -> None:
        self._log = log
        self._next = 0
        self._at_end = False

    def poll(self, timeout: float = 0) -> FakeMessage | None:
        with self._log.changed:
            if self._next >= len(self._log.records) and self._at_end:
                self._log.changed.wait(timeout)
            if self._next < len(self._log.records):
                key, value = self._log.records[self._next]
                self._next += 1
                self._at_end = False
                return FakeMessage(key, value, self._next - 1)
            if not self._at_end:
                self._at_end = True
                return FakeMessage(None, None, -1, KafkaError(KafkaError._PARTITION_EOF))
            return None

    def close(self) -> None:
        pass


class FakeProbe:
    def __init__(self, log: FakeLog) -> None:
        self._log = log

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        if self._log.down:
            raise _unreachable()
        with self._log.changed:
            return 0, len(self._log.records)

    def close(self) -> None:
        pass


class QuietFollower(ResultsFollower):
    """Counts what the test tells it to (:meth:`tally`/``register``), reads nothing."""

    def follow(self, active: list[BatchRecord]) -> bool:
        for batch in active:
            self.register(batch)
        return False

    def close(self) -> None:
        pass


class QuietLifecycle(Lifecycle):
    """The real lifecycle without Kafka: publishes nothing, records the stops it would
    announce, and runs its steps only when the test calls ``_step``."""

    def __init__(self, config: Config, state: StateTopic, store: LocalStore) -> None:
        super().__init__(config, state, store, file_limits(config.api))
        self.results = QuietFollower(config, answers_dir(config.api))
        self.stops: list[Stop] = []

    def start(self) -> None:
        pass

    @property
    def healthy(self) -> bool:
        return True

    def _publish(self, batch_id: str) -> None:
        with self._publish_lock:
            self._publishing.discard(batch_id)

    def _announce(self, stop: Stop) -> None:
        self.stops.append(stop)


def unit_config(tmp_path: Path, **api: Any) -> Config:
    return replace(Config(), api=replace(ApiConfig(), store_dir=str(tmp_path / "files"), **api))


def state_on(log: FakeLog, config: Config) -> StateTopic:
    state = StateTopic(config.kafka, log.clients())
    state.start()
    return state


def services(config: Config, keys: Keys = KEYS, log: FakeLog | None = None) -> Services:
    state = state_on(log or FakeLog(), config)
    store = LocalStore(Path(config.api.store_dir))
    return Services(
        config=config,
        keys=keys,
        state=state,
        store=store,
        lifecycle=QuietLifecycle(config, state, store),
        metrics=ApiMetrics(),
    )


@contextmanager
def client(svc: Services) -> Iterator[TestClient]:
    """A TestClient on the app over ``svc`` (lifespan run: ``svc`` closed at the end)."""
    app = create_app(svc.config, svc.keys, start=lambda config, keys: svc)
    with TestClient(app, base_url="http://127.0.0.1:8000") as test_client:
        yield test_client


def stored_file(
    svc: Services, owner: str = "alice", lines: int = 2, content: bytes | None = None
) -> FileRecord:
    """An uploaded file's record and bytes (``lines`` × :data:`LINE` unless given),
    written as an upload would leave them."""
    record = FileRecord(
        id=new_file_id(),
        owner=owner,
        filename="in.jsonl",
        size=10,
        created_at=int(time.time()),
        purpose="batch",
        lines=lines,
        endpoints=("chat",),
        model="echo",
    )
    with svc.store.staging() as path:
        path.write_bytes(LINE * lines if content is None else content)
        svc.store.put(record.id, path)
    svc.state.put_file(record)
    return record


def stored_batch(svc: Services, file: FileRecord, **changes: Any) -> BatchRecord:
    """A batch of ``file``, written as created and then changed by ``changes``."""
    now = time.time()
    batch = svc.state.put_batch(
        BatchRecord(
            id=new_batch_id(now),
            owner=file.owner,
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            created_at=int(now),
            expires_at=int(now) + 86400,
            model=file.model,
            counts=Counts(total=file.lines),
        )
    )
    return svc.state.put_batch(replace(batch, **changes)) if changes else batch


def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Wait (bounded) for ``condition``; its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
