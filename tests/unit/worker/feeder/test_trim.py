"""The pending partition trimmed below the feeder group's committed offset
(worker/feeder/trim.py, issue 38): at most every TRIM_EVERY_S, one request at a time,
never waited for; a broker without DeleteRecords is said once and trimming stops."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.feeder.trim import TRIM_EVERY_S, Trim


class Admin:
    def __init__(self) -> None:
        self.asked: list[int] = []
        self.futures: list[Future[Any]] = []

    def delete_records(
        self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
    ) -> dict[TopicPartition, Future[Any]]:
        (partition,) = topic_partition_offsets
        self.asked.append(partition.offset)
        self.futures.append(Future())
        return {partition: self.futures[-1]}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_records_below_the_committed_offset_are_deleted_at_most_every_period() -> None:
    admin, clock, reports = Admin(), Clock(), []
    trim = Trim(admin, "t.pending", lambda ok, at: reports.append((ok, at)), clock)
    trim.committed(100)
    assert admin.asked == [100]
    trim.committed(200)  # one request at a time: the first is in flight
    admin.futures[0].set_result(None)
    clock.now += 1.0
    trim.committed(300)  # answered, but within the period
    assert admin.asked == [100] and trim.trimmed == 100 and reports == [(True, 100)]
    clock.now += TRIM_EVERY_S
    trim.committed(300)
    trim.committed(300)
    assert admin.asked == [100, 300]


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError.UNSUPPORTED_VERSION])
def test_a_broker_without_delete_records_is_said_once_and_left_alone(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    admin, clock, reports = Admin(), Clock(), []
    trim = Trim(admin, "t.pending", lambda ok, at: reports.append((ok, at)), clock)
    trim.committed(100)
    admin.futures[0].set_exception(KafkaException(KafkaError(code, "closed")))
    trim.poll()
    clock.now += 10 * TRIM_EVERY_S
    trim.committed(500)
    assert admin.asked == [100] and not trim.supported and reports == [(False, 0)]
    assert "does not delete records" in caplog.text


def test_another_failure_is_tried_again_a_period_later(caplog: pytest.LogCaptureFixture) -> None:
    admin, clock = Admin(), Clock()
    trim = Trim(admin, "t.pending", lambda ok, at: None, clock)
    trim.committed(100)
    admin.futures[0].set_exception(KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT)))
    clock.now += TRIM_EVERY_S
    trim.committed(150)
    assert admin.asked == [100, 150] and trim.supported
    assert "trimming t.pending below 100 failed" in caplog.text
