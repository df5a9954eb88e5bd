"""The transactional path on a real broker: commit moves offsets, abort does not, a zombie
is fenced (a lost generation, not an exit); and engine faults: split-and-retry, out of
memory, a hung engine, a bad model."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from uuid import uuid4

import pytest
from confluent_kafka import Consumer, TopicPartition
from msgspec import structs

from batcher import OffsetTracker
from tests import ROOT
from tests.integration.harness import publish, read_results, running_worker
from worker.config import Config
from worker.engines.base import EngineInput, EngineOutOfMemory, OnComplete
from worker.engines.echo import EchoEngine
from worker.kafka import clients
from worker.kafka.publisher import GenerationLost
from worker.kafka.stable import BrokerStableCheck
from worker.kafka.transactions import TransactionalPublisher
from worker.loop.service import EXIT_WEDGED, Worker
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

pytestmark = pytest.mark.integration


def requests(n: int, text: str = "hello") -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            messages=(ChatMessage("user", f"{text} {i}"),),
            sampling=SamplingParams(max_tokens=16, temperature=0.0),
        )
        for i in range(n)
    ]


def echo(config: Config, **engine: object) -> Config:
    return replace(
        config,
        engine=replace(config.engine, kind="echo", model="echo", **engine),  # type: ignore[arg-type]
        batching=replace(config.batching, max_batch_size=8, adaptive=False),
    )


Record = tuple[str, int, int]  # topic, partition, offset


def consume_assigned(config: Config, n: int) -> tuple[Consumer, list[Record]]:
    consumer = clients.consumer(config.kafka)
    consumer.subscribe([config.kafka.requests_topic])
    seen: list[Record] = []
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=n, timeout=0.2):
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            if m.error() is None and topic is not None and partition is not None:
                seen.append((topic, partition, offset or 0))
    assert len(seen) == n
    return consumer, seen


def answer(
    publisher: TransactionalPublisher, tracker: OffsetTracker, topic: str, records: Sequence[Record]
) -> None:
    for t, p, o in records:
        publisher.send(topic, "k", b"v", [], (t, p), partial(tracker.done, (t, p), o))


def committed(consumer: Consumer, topic: str) -> int:
    (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    return tp.offset


def test_commit_moves_offsets_and_a_loss_leaves_them(kafka_config: Config) -> None:
    config = replace(kafka_config, kafka=replace(kafka_config.kafka, partitions=1))
    publish(config, requests(10))
    consumer, seen = consume_assigned(config, 10)
    tracker = OffsetTracker()
    for topic, partition, offset in seen:
        tracker.add((topic, partition), offset)
    producers = clients.Producers.of(config.kafka, config.limits)
    publisher = TransactionalPublisher(
        config.kafka,
        consumer,
        tracker,
        producers,
        f"txn-{uuid4()}",
        BrokerStableCheck(config.kafka),
    )
    publisher.assign({(t, p) for t, p, _ in seen})
    results, requests_topic = config.kafka.results_topic, config.kafka.requests_topic

    answer(publisher, tracker, results, seen[:4])
    publisher.commit()
    assert committed(consumer, requests_topic) == seen[3][2] + 1
    answer(publisher, tracker, results, seen[4:8])
    # lost before they were committed: offsets stay where the commit left them
    publisher.lost([(requests_topic, 0)])
    assert (publisher.commits, publisher.aborts) == (1, 0)
    assert committed(consumer, requests_topic) == seen[3][2] + 1
    consumer.close()


def _same_slot(
    config: Config, consumer: Consumer
) -> tuple[TransactionalPublisher, TransactionalPublisher]:
    """Two publishers under one transactional prefix: the second the next owner."""
    prefix = f"txn-{uuid4()}"
    producers = clients.Producers.of(config.kafka, config.limits)
    k = config.kafka
    zombie, successor = (
        TransactionalPublisher(
            k, consumer, OffsetTracker(), producers, prefix, BrokerStableCheck(k)
        )
        for _ in range(2)
    )
    return zombie, successor


def test_the_next_owner_of_a_partition_fences_the_previous_one(kafka_config: Config) -> None:
    publish(kafka_config, requests(2))
    consumer, seen = consume_assigned(kafka_config, 2)
    origin = seen[0][:2]
    results = kafka_config.kafka.results_topic
    zombie, successor = _same_slot(kafka_config, consumer)
    zombie.assign([origin])
    zombie.send(results, "k", b"old", [], origin, lambda: None)
    successor.assign([origin])  # same partition, same transactional.id: the zombie is fenced
    successor.send(results, "k", b"new", [], origin, lambda: None)
    successor.commit()
    with pytest.raises(GenerationLost):
        zombie.send(results, "k", b"late", [], origin, lambda: None)
        zombie.commit()
    consumer.close()


def test_losing_a_partition_whose_producer_was_fenced_is_quiet(kafka_config: Config) -> None:
    publish(kafka_config, requests(2))
    consumer, seen = consume_assigned(kafka_config, 2)
    origin = seen[0][:2]
    results = kafka_config.kafka.results_topic
    zombie, successor = _same_slot(kafka_config, consumer)
    zombie.assign([origin])
    zombie.send(results, "k", b"old", [], origin, lambda: None)  # a transaction left open
    successor.assign([origin])  # fences the zombie
    zombie.lost([origin])  # aborting on the fenced producer: logged, not raised
    with pytest.raises(RuntimeError, match="does not own"):
        zombie.send(results, "k", b"late", [], origin, lambda: None)
    successor.send(results, "k", b"new", [], origin, lambda: None)
    successor.commit()
    consumer.close()


class PoisonEngine(EchoEngine):
    """Fails any batch holding a prompt with "poison"; out of memory above 4 requests."""

    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        if len(inputs) > 4:
            raise EngineOutOfMemory(f"{len(inputs)} requests do not fit")
        if any(b"poison" in bytes(i.prompt_token_ids) for i in inputs):
            raise RuntimeError("the kernel crashed")
        super().run_batch(inputs, on_complete)


def test_a_failing_batch_is_split_and_only_the_bad_request_fails(kafka_config: Config) -> None:
    config = echo(kafka_config)
    batch = requests(30)
    batch[7] = structs.replace(batch[7], messages=(ChatMessage("user", "poison pill"),))
    publish(config, batch)
    with running_worker(config, PoisonEngine()) as worker:
        results = read_results(config, 30)
        shrunk = worker.adaptive.size
    errors = {r.custom_id: r.error.code for r in results if r.error}
    assert errors == {"r7": 5000}
    assert len({r.custom_id for r in results}) == 30
    assert shrunk < config.batching.max_batch_size  # halved on each out-of-memory


class HangingEngine(EchoEngine):
    def run_batch(self, inputs: Sequence[EngineInput], on_complete: OnComplete) -> None:
        if any(b"hang" in bytes(i.prompt_token_ids) for i in inputs):
            time.sleep(30)
        super().run_batch(inputs, on_complete)


def test_a_hung_engine_wedges_the_worker_it_exits_4_and_the_next_owner_answers(
    kafka_config: Config,
) -> None:
    config = echo(kafka_config, engine_timeout_s=1.0)
    # one request per batch: the hung one goes alone, the others wait behind it
    config = replace(config, batching=replace(config.batching, max_batch_size=1))
    ids = {f"r{i}" for i in range(4)}
    publish(config, requests(1, text="hang") + requests(4)[1:])

    hung = Worker(replace(config, metrics=replace(config.metrics, port=0)), HangingEngine())
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(hung.run()), daemon=True)
    thread.start()
    thread.join(60)
    assert exit_codes == [EXIT_WEDGED]  # left the group, for the orchestrator to restart it
    liveness = hung.health.liveness()
    assert not liveness.alive and "engine_timeout_s=1" in liveness.reason

    with running_worker(config):  # the restarted process, or any other member
        results = read_results(config, len(ids))
    outcomes = {r.custom_id: r.error.code if r.error else r.status for r in results}
    assert len(results) == len(ids)  # each answered once
    assert outcomes == {"r0": 5000, "r1": "completed", "r2": "completed", "r3": "completed"}


def test_a_model_that_fails_to_load_exits_with_code_3(kafka_config: Config) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "batchpipe.cli", "worker",
            "--bootstrap", kafka_config.kafka.bootstrap_servers,
            "--set", "engine.kind=hf", "--set", "engine.model=/nonexistent/model.gguf",
            "--set", "metrics.port=0",
        ],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "5003" in done.stderr
