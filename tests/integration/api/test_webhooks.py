"""Webhooks and the events topic end to end: the official SDK against ``batchpipe serve``
on the session's broker, with a receiver of the test's own on 127.0.0.1 (the only place
anything is sent: ``api.webhook_allow_networks`` opens 127.0.0.1/32 and nothing else).

- every end of a batch reaches the receiver, and ``client.webhooks.unwrap`` parses each
  into its type; a wrong secret is refused;
- a read_committed consumer of the events topic finds exactly one event per change;
- a receiver answering 500 for 30 s gets every event once it recovers, with ``serve``
  restarted in between;
- two replicas deliver each event once; a repeat comes only after an answer too late
  and a hand-over, with the same ``webhook-id``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from confluent_kafka import KafkaError, TopicPartition
from openai import InvalidWebhookSignatureError, OpenAI

from batchpipe.api import batches
from batchpipe.api.app import Server
from batchpipe.api.webhooks.relay import events_topic
from tests.integration.api.conftest import KEYS, Serve, sdk
from tests.integration.api.test_sdk_echo import batch_file, wait_for
from tests.integration.harness import running_worker
from worker.config import Config
from worker.kafka import clients
from worker.kafka.consumer import FROM_START

pytestmark = pytest.mark.integration

SECRET = "whsec_" + base64.b64encode(b"the receiver's secret, 32 bytes!").decode()
SECRET_ENV = "BATCHPIPE_TEST_WEBHOOK_SECRET"
WAIT_S = 120.0


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers 500 until ``failing_until``
    (time.monotonic()), 204 after, and keeps every delivery it saw. With ``hold`` set it
    takes the first delivery but answers it only once ``hold`` is set (too late)."""

    def __init__(self) -> None:
        self.failing_until = 0.0
        self.hold: threading.Event | None = None
        self.seen: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                status = 500 if time.monotonic() < receiver.failing_until else 204
                with receiver._lock:
                    receiver.seen.append(Delivery(dict(self.headers), body, status))
                    first = len(receiver.seen) == 1
                if first and receiver.hold is not None:
                    receiver.hold.wait(WAIT_S)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self._server.shutdown()
        self._server.server_close()

    def delivered(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.seen if d.status == 204]

    def wait(self, condition: Callable[[list[Delivery]], bool], what: str) -> list[Delivery]:
        deadline = time.monotonic() + WAIT_S
        while not condition(self.delivered()):
            assert time.monotonic() < deadline, f"{what}: {len(self.seen)} deliveries seen"
            time.sleep(0.2)
        return self.delivered()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture
def hook_config(api_config: Config, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    api = replace(
        api_config.api,
        webhooks={"alice": {"url": receiver.url, "secret_env": SECRET_ENV}},
        webhook_allow_networks=("127.0.0.1/32",),
        webhook_backoff_s=0.5,
        webhook_backoff_max_s=4.0,
        cancel_grace_s=0.5,
    )
    return replace(api_config, api=api)


def unwrap(delivery: Delivery, secret: str = SECRET) -> tuple[str, str]:
    """(type, batch id) of a delivery the SDK verified."""
    event = OpenAI(api_key="unused").webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
    data = json.loads(delivery.body)["data"]
    assert event.id == json.loads(delivery.body)["id"]
    return event.type, str(data["id"])


def failing_batch(client: OpenAI, tmp_path: Path, name: str) -> str:
    """A batch that ends ``failed`` at once (a line for another endpoint)."""
    source = tmp_path / f"{name}.jsonl"
    line = {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
    source.write_text(json.dumps(line) + "\n")
    file = client.files.create(file=source.open("rb"), purpose="batch")
    return client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def create(client: OpenAI, tmp_path: Path, name: str, count: int = 3) -> str:
    file = client.files.create(
        file=batch_file(tmp_path / f"{name}.jsonl", count).open("rb"), purpose="batch"
    )
    return client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def events_on_topic(config: Config, count: int) -> list[dict[str, object]]:
    """At least ``count`` events, read by a read_committed consumer of its own group."""
    consumer = clients.consumer(  # read_committed
        config.kafka, "test-events-reader", extra={"enable.partition.eof": True}
    )
    topic = events_topic(config.kafka)
    partitions = clients.admin(config.kafka).list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, FROM_START) for p in partitions])
    found: list[dict[str, object]] = []
    at_end: set[int] = set()  # partitions read to their end since their last record
    deadline = time.monotonic() + WAIT_S
    try:
        # at least count events, then everything committed to every partition's end
        while len(found) < count or at_end != set(partitions):
            assert time.monotonic() < deadline, f"{len(found)} of {count} events on {topic}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is None:
                found.append(json.loads(msg.value() or b""))
                at_end.discard(msg.partition() or 0)
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition() or 0)
    finally:
        consumer.close()
    return found


def test_every_end_is_delivered_signed_and_on_the_events_topic_once(
    hook_config: Config,
    serve: Serve,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serve(hook_config) as server:
        client = sdk(server)
        failed = failing_batch(client, tmp_path, "failed")
        monkeypatch.setitem(batches.COMPLETION_WINDOWS_S, "24h", 1)  # no worker yet
        expired = create(client, tmp_path, "expired")
        monkeypatch.setitem(batches.COMPLETION_WINDOWS_S, "24h", 24 * 3600)
        wait_for(client, expired, {"expired"})
        cancelled = create(client, tmp_path, "cancelled")
        client.batches.cancel(cancelled)
        wait_for(client, cancelled, {"cancelled"})
        with running_worker(hook_config):
            completed = create(client, tmp_path, "completed")
            wait_for(client, completed, {"completed"})
        ends = {
            failed: "batch.failed",
            expired: "batch.expired",
            cancelled: "batch.cancelled",
            completed: "batch.completed",
        }
        got = receiver.wait(lambda d: len(d) >= 4, "the four ends")
        assert sorted(unwrap(d) for d in got) == sorted((t, b) for b, t in ends.items())
        assert len({d.headers["webhook-id"] for d in got}) == 4
        with pytest.raises(InvalidWebhookSignatureError):
            unwrap(got[0], secret="whsec_" + base64.b64encode(b"not the secret").decode())

        # bob has no endpoint: his batch is on the events topic only
        bob = failing_batch(sdk(server, "sk-bob"), tmp_path, "bob")
        changes = {
            failed: ["validating", "failed"],
            expired: ["validating", "in_progress", "expired"],
            completed: ["validating", "in_progress", "finalizing", "completed"],
            bob: ["validating", "failed"],
        }
        events = events_on_topic(hook_config, 2 + 3 + 4 + 2 + 3)
        per_batch: dict[str, list[str]] = {}
        for event in events:
            data = event["data"]
            assert isinstance(data, dict)
            per_batch.setdefault(str(data["id"]), []).append(str(event["type"]))
        for batch_id, statuses in changes.items():
            assert per_batch[batch_id] == [f"batch.{s}" for s in statuses]
        # cancelled while validating or after publication: each change once, in order
        assert per_batch[cancelled][0] == "batch.validating"
        assert per_batch[cancelled][-2:] == ["batch.cancelling", "batch.cancelled"]
        assert len(per_batch[cancelled]) == len(set(per_batch[cancelled]))
        assert set(per_batch) == {*changes, cancelled}
        assert len(receiver.delivered()) == 4  # nothing for bob, nothing repeated

        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        assert 'batchpipe_api_webhook_deliveries_total{outcome="delivered"} 4.0' in metrics
        assert SECRET not in metrics and SECRET.removeprefix("whsec_") not in metrics


def test_a_receiver_down_for_30s_gets_every_event_across_a_restart(
    hook_config: Config, serve: Serve, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.failing_until = time.monotonic() + 30
    with serve(hook_config) as server:
        client = sdk(server)
        ids = [failing_batch(client, tmp_path, f"b{i}") for i in range(3)]
        # every event was tried and refused at least once before the restart
        deadline = time.monotonic() + WAIT_S
        while {unwrap(d)[1] for d in receiver.seen if d.status == 500} != set(ids):
            assert time.monotonic() < deadline, "not every event was tried"
            time.sleep(0.2)
    with serve(hook_config) as server:
        client = sdk(server)
        ids.append(failing_batch(client, tmp_path, "after"))
        got = receiver.wait(lambda d: {unwrap(x)[1] for x in d} == set(ids), "every event")
        assert receiver.failing_until <= time.monotonic()
        assert sorted(unwrap(d) for d in got) == sorted(("batch.failed", b) for b in ids)
        retried = [d for d in receiver.seen if d.status == 500]
        assert {d.headers["webhook-id"] for d in retried} <= {
            d.headers["webhook-id"] for d in got
        }  # the retries carried the ids that were finally delivered


def test_two_replicas_deliver_each_event_once(
    hook_config: Config, serve: Serve, receiver: Receiver, tmp_path: Path
) -> None:
    with serve(hook_config) as one, serve(hook_config) as two:
        replicas = (one, two)
        deadline = time.monotonic() + WAIT_S
        while sum(delivering(s) for s in replicas) != 1:  # one of them delivers
            assert time.monotonic() < deadline, "no replica took the events partition"
            time.sleep(0.2)
        ids = [
            failing_batch(sdk(s), tmp_path, f"r{i}-{n}")
            for n, s in enumerate(replicas)
            for i in range(3)
        ]
        got = receiver.wait(lambda d: {unwrap(x)[1] for x in d} == set(ids), "every event")
        assert len(got) == len(ids) == 6
        assert len({d.headers["webhook-id"] for d in got}) == 6
        assert sum(delivered_count(s) for s in replicas) == 6


def test_a_repeat_comes_only_after_an_answer_too_late_and_carries_the_same_webhook_id(
    hook_config: Config, receiver: Receiver, tmp_path: Path
) -> None:
    """When a repeat happens: the receiver took a delivery but answered after
    ``webhook_timeout_s``, and the replica that sent it handed over; the next one sends
    the same bytes with the same ``webhook-id``."""
    config = replace(hook_config, api=replace(hook_config.api, webhook_timeout_s=1.0))
    receiver.hold = threading.Event()
    replicas = [Server(config, KEYS).start(), Server(config, KEYS).start()]
    try:
        deadline = time.monotonic() + WAIT_S
        while sum(delivering(s) for s in replicas) != 1:
            assert time.monotonic() < deadline, "no replica took the events partition"
            time.sleep(0.2)
        owner = next(s for s in replicas if delivering(s))
        batch = failing_batch(sdk(owner), tmp_path, "late")
        while not receiver.seen:  # taken, and held past the sender's timeout
            assert time.monotonic() < deadline, "nothing was delivered"
            time.sleep(0.2)
        owner.stop()
        replicas.remove(owner)
        got = receiver.wait(lambda d: len(d) >= 2, "the repeat")
        assert [unwrap(d) for d in got] == [("batch.failed", batch)] * 2
        assert got[0].headers["webhook-id"] == got[1].headers["webhook-id"]
        assert got[0].body == got[1].body
    finally:
        receiver.hold.set()
        for server in replicas:
            server.stop()


def delivering(server: object) -> bool:
    return "batchpipe_api_webhook_delivering 1.0" in metrics_of(server)


def metrics_of(server: object) -> str:
    return requests.get(f"{server.url}/metrics", timeout=10).text  # type: ignore[attr-defined]


def delivered_count(server: object) -> float:
    for line in metrics_of(server).splitlines():
        if line.startswith('batchpipe_api_webhook_deliveries_total{outcome="delivered"}'):
            return float(line.split()[-1])
    return 0.0
