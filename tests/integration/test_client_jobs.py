"""Batch jobs through the Client and CLI on a real broker, with results published directly.

No worker runs here: results are InferenceResult records written to the results topic
with the codec, as a worker would, so collect/status are tested on their own. The tests
read what was published from the requests topic, so they publish with fair share off
(``scheduling.fair: false``: straight into the requests topic); the pending topic's path
is tested in tests/integration/test_fair_share.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from msgspec import structs

from batchpipe import BatchFileError, BatchNotFoundError, Client, CollectTimeoutError
from batchpipe.collect import CLOCK_SKEW_S, open_reader, record_headers, records
from tests import ROOT
from worker.config import Config, LimitsConfig
from worker.kafka import clients
from worker.wire.batchline import parse_line
from worker.wire.codec import CodecLimits, decode_request, encode_result
from worker.wire.messages import ErrorInfo, InferenceRequest, InferenceResult, Usage

pytestmark = pytest.mark.integration

LIMITS = CodecLimits.from_config(LimitsConfig())


@pytest.fixture
def kafka_config(kafka_config: Config) -> Config:
    """The session's config with fair share off: these tests play the worker."""
    return replace(kafka_config, scheduling=replace(kafka_config.scheduling, fair=False))


EVERY_FIELD: list[dict[str, Any]] = [
    {
        "custom_id": "chat-all",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "echo",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "héllo"}]},
                {"role": "assistant", "content": "hi"},
                {"role": "user", "content": "again"},
            ],
            "max_tokens": 16,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "seed": 7,
            "stop": ["\n", "END"],
            "presence_penalty": 0.1,
            "frequency_penalty": -0.2,
            "repetition_penalty": 1.1,
            "enable_thinking": False,
            "metadata": {"from": "body"},
        },
        "metadata": {"task": "summary", "row": "1"},
        "priority": 3,
        "deadline": 4_000_000_000.5,
    },
    {
        "custom_id": "prompt",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "echo", "prompt": "once upon", "max_tokens": 8},
    },
    {
        "custom_id": "tokens",
        "method": "POST",
        "url": "/v1/completions",
        "body": {
            "model": "echo",
            "prompt": [1, 2, 3],
            "chat_template_kwargs": {"enable_thinking": True},
        },
    },
]


def chat_line(custom_id: str) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "echo", "messages": [{"role": "user", "content": custom_id}]},
        "metadata": {"id": custom_id},
    }


def write_jsonl(path: Path, lines: Iterable[dict[str, Any] | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def answer(req: InferenceRequest, ok: bool = True) -> InferenceResult:
    return InferenceResult(
        custom_id=req.custom_id,
        batch_id=req.batch_id,
        batch_total=req.batch_total,
        metadata=req.metadata,
        status="completed" if ok else "failed",
        text=f"echo {req.custom_id}" if ok else "",
        finish_reason="stop" if ok else "error",
        usage=Usage(prompt_tokens=4, completion_tokens=2 if ok else 0, reasoning_tokens=1),
        error=None if ok else ErrorInfo(4003, "prompt too long"),
        model="echo",
        created_at=time.time(),
    )


def publish_results(config: Config, results: Iterable[InferenceResult]) -> None:
    kafka = config.kafka
    clients.ensure_topics(kafka, [kafka.results_topic])
    producer = clients.producer(kafka)
    for res in results:
        value, headers = encode_result(res)
        producer.produce(
            kafka.results_topic,
            value=value,
            key=res.custom_id.encode(),
            headers=list(headers),
        )
    assert producer.flush(30) == 0


def read_requests(config: Config) -> list[InferenceRequest]:
    """Everything on the requests topic, from the beginning to its end."""
    kafka = config.kafka
    consumer, partitions = open_reader(kafka, kafka.requests_topic, None)
    try:
        return [
            decode_request(m.value(), record_headers(m), LIMITS)
            for m in records(consumer, partitions, until_end=True, deadline=time.monotonic() + 60)
        ]
    finally:
        consumer.close()


def submitted(client: Client, tmp_path: Path, n: int) -> tuple[str, list[InferenceRequest]]:
    path = write_jsonl(tmp_path / "batch.jsonl", (chat_line(f"r{i}") for i in range(n)))
    receipt = client.submit_file(path)
    requests = read_requests(client.config)
    assert len(requests) == n
    return receipt.batch_id, requests


def test_submit_round_trips_every_supported_field(kafka_config: Config, tmp_path: Path) -> None:
    client = Client(kafka_config)
    before = time.time()
    receipt = client.submit_file(write_jsonl(tmp_path / "all.jsonl", EVERY_FIELD))
    assert receipt.batch_id.startswith("batch_") and receipt.total == 3
    assert before <= receipt.submitted_at <= time.time()
    published = {r.custom_id: r for r in read_requests(kafka_config)}
    assert len(published) == 3
    for line in EVERY_FIELD:
        expected = structs.replace(
            parse_line(line),
            batch_id=receipt.batch_id,
            batch_total=3,
            submitted_at=receipt.submitted_at,
        )
        assert published[line["custom_id"]] == expected
    assert dict(published["chat-all"].metadata) == {"from": "body", "task": "summary", "row": "1"}


def test_file_with_bad_lines_publishes_nothing(kafka_config: Config, tmp_path: Path) -> None:
    kafka = kafka_config.kafka
    clients.ensure_topics(kafka, [kafka.requests_topic])
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            chat_line("a"),
            "{wrong json",
            chat_line("a"),
            {**chat_line("big"), "pad": "x" * 2000},
            {**chat_line("u"), "url": "/v1/embeddings"},
            chat_line("b"),
        ],
    )
    client = Client(kafka_config, limits=replace(Client(kafka_config).limits, max_line_bytes=1000))
    with pytest.raises(BatchFileError) as exc:
        client.submit_file(path)
    assert [(p.line_no, p.code) for p in exc.value.problems] == [
        (2, 4001),
        (3, 4001),
        (4, 4003),
        (5, 4002),
    ]
    consumer = clients.consumer(kafka, "empty-check")
    try:
        for partition in range(kafka.partitions):
            tp = TopicPartition(kafka.requests_topic, partition)
            assert consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] == 0
    finally:
        consumer.close()


def test_collect_writes_one_line_per_custom_id(kafka_config: Config, tmp_path: Path) -> None:
    client = Client(kafka_config)
    batch_id, requests = submitted(client, tmp_path, 6)
    other = [structs.replace(requests[0], batch_id="another-batch")]
    answers = [answer(r, ok=r.custom_id != "r5") for r in requests]
    # a worker restart answered r0..r2 twice; another batch's result shares the topic
    publish_results(kafka_config, [*answers[:3], *map(answer, other), *answers[:3], *answers[3:]])

    output, errors = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    status = client.collect(batch_id, output, errors, timeout_s=60)
    out_lines = [json.loads(x) for x in output.read_text().splitlines()]
    err_lines = [json.loads(x) for x in errors.read_text().splitlines()]
    assert sorted(x["custom_id"] for x in out_lines) == [f"r{i}" for i in range(5)]
    assert [x["custom_id"] for x in err_lines] == ["r5"]
    assert err_lines[0]["error"] == {"code": "4003", "message": "prompt too long", "param": None}
    assert out_lines[0]["metadata"] == {"id": out_lines[0]["custom_id"]}
    assert (status.total, status.completed, status.failed, status.state) == (6, 5, 1, "completed")

    report = client.status(batch_id, price_per_1k=0.5)
    assert (report.total, report.completed, report.failed) == (6, len(out_lines), len(err_lines))
    assert report.state == "completed"
    assert (report.prompt_tokens, report.completion_tokens, report.reasoning_tokens) == (24, 10, 6)
    assert report.cost == pytest.approx(34 / 1000 * 0.5)


def test_results_iterator_deduplicates_and_stops_when_complete(
    kafka_config: Config, tmp_path: Path
) -> None:
    client = Client(kafka_config)
    batch_id, requests = submitted(client, tmp_path, 4)
    publish_results(kafka_config, [answer(r) for r in requests + requests])
    started = time.monotonic()
    got = [r.custom_id for r in client.results(batch_id, timeout_s=60)]
    assert sorted(got) == ["r0", "r1", "r2", "r3"]
    assert time.monotonic() - started < 30


def test_resubmitting_with_the_same_id_does_not_double_count(
    kafka_config: Config, tmp_path: Path
) -> None:
    client = Client(kafka_config)
    path = write_jsonl(tmp_path / "b.jsonl", (chat_line(f"r{i}") for i in range(3)))
    first = client.submit_file(path)
    second = client.submit_file(path, batch_id=first.batch_id)
    assert second.batch_id == first.batch_id
    requests = read_requests(kafka_config)
    assert len(requests) == 6
    publish_results(kafka_config, [answer(r) for r in requests])
    status = client.status(first.batch_id)
    assert (status.total, status.completed, status.state) == (3, 3, "completed")


def test_status_before_results_and_expiry(kafka_config: Config, tmp_path: Path) -> None:
    client = Client(kafka_config)
    receipt = client.submit([chat_line("a"), chat_line("b")], batch_id="my-own-id")
    status = client.status(receipt.batch_id)
    assert (status.total, status.completed, status.state) == (2, 0, "in_progress")
    assert status.submitted_at == pytest.approx(receipt.submitted_at)
    assert client.status(receipt.batch_id, completion_window_s=0).state == "expired"
    with pytest.raises(BatchNotFoundError):
        client.status("no-such-batch")


def test_readers_start_at_the_submit_time(kafka_config: Config, tmp_path: Path) -> None:
    client = Client(kafka_config)
    path = write_jsonl(tmp_path / "b.jsonl", (chat_line(f"r{i}") for i in range(2)))
    client.submit_file(path, batch_id="fixed-id")
    requests = read_requests(kafka_config)
    # stale failures under the same id, written before the time readers are told to start
    publish_results(kafka_config, [answer(r, ok=False) for r in requests])
    time.sleep(1.0)
    start = time.time()
    time.sleep(0.2)
    publish_results(kafka_config, [answer(r) for r in requests])
    from_start = client.status("fixed-id")  # no time in the id: the whole topic, first wins
    assert (from_start.completed, from_start.failed) == (0, 2)
    from_time = client.status("fixed-id", since=start + CLOCK_SKEW_S)
    assert (from_time.completed, from_time.failed) == (2, 0)


def test_collect_timeout_keeps_what_arrived(kafka_config: Config, tmp_path: Path) -> None:
    client = Client(kafka_config)
    batch_id, requests = submitted(client, tmp_path, 3)
    publish_results(kafka_config, [answer(requests[0])])
    output = tmp_path / "out.jsonl"
    with pytest.raises(CollectTimeoutError) as exc:
        client.collect(batch_id, output, tmp_path / "err.jsonl", timeout_s=3)
    assert (exc.value.status.completed, exc.value.status.total) == (1, 3)
    assert "1 of 3 requests answered" in str(exc.value)
    written = [json.loads(x)["custom_id"] for x in output.read_text().splitlines()]
    assert written == [requests[0].custom_id]


def test_cli_submit_status_collect_without_a_terminal(kafka_config: Config, tmp_path: Path) -> None:
    kafka = kafka_config.kafka
    common = [
        "--bootstrap",
        kafka.bootstrap_servers,
        "--set",
        f"kafka.requests_topic={kafka.requests_topic}",
        "--set",
        f"kafka.results_topic={kafka.results_topic}",
        "--set",
        f"kafka.dead_letter_topic={kafka.dead_letter_topic}",
        "--set",
        "scheduling.fair=false",
    ]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "batchpipe.cli", *args, *common]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)

    path = write_jsonl(tmp_path / "b.jsonl", (chat_line(f"r{i}") for i in range(3)))
    done = cli("submit", str(path))
    assert done.returncode == 0, done.stderr
    batch_id = done.stdout.strip()
    requests = read_requests(kafka_config)
    publish_results(kafka_config, [answer(r) for r in requests])

    output, errors = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    done = cli("collect", "--batch-id", batch_id, "-o", str(output), "--errors", str(errors))
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr  # stderr is a pipe: plain lines, no bar
    assert f"{batch_id}: 3/3 (100%)" in done.stderr
    assert len(output.read_text().splitlines()) == 3 and errors.read_text() == ""

    done = cli("collect", "--batch-id", batch_id, "-o", "-", "--errors", str(errors), "--quiet")
    assert done.returncode == 0 and done.stderr == ""
    assert len(done.stdout.splitlines()) == 3

    done = cli("status", batch_id, "--json", "--price-per-1k", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert report["status"] == "completed" and report["cost"] == pytest.approx(0.018)
