"""Answers bigger than the producers' message.max.bytes: never fatal, always answered.

librdkafka refuses such a record at ``produce`` (``MSG_SIZE_TOO_LARGE``); the fake
publisher does the same (:attr:`FakeBroker.max_message_bytes`). A result that does not fit
becomes a 4003 error result for its request; a dead letter keeps the original bytes when
it can, else it becomes a 4003 dead letter naming the size.
"""

from __future__ import annotations

import secrets
from collections import Counter

import pytest

from worker.errors import ErrorCode
from worker.wire.messages import InferenceRequest

from .fakes import Delivery, GatedEngine, Sent
from .rig import P0, P1, RESULTS, loop_config, rig

DEAD = "dead-letter"


def incompressible(chars: int) -> str:
    """Text zstd cannot shrink much, so that a result carrying it stays big."""
    return secrets.token_urlsafe(chars)[:chars]


def headers_of(sent: Sent) -> dict[str, bytes | str | None]:
    return dict(sent.headers)


def test_a_result_over_the_producer_limit_is_a_4003_answer_for_its_request() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        big = InferenceRequest(
            custom_id="big",
            batch_id="B",
            batch_total=2,
            prompt="hi",
            metadata={"blob": incompressible(1_500_000)},
        )
        r.broker.submit_request(0, big)
        r.broker.submit(0, "small", "hello")
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled({"big", "small"}), "both answered and committed")

        assert r.answers() == Counter({"big": 1, "small": 1})
        results = {result.custom_id: result for result in r.results()}
        answer = results["big"]
        assert answer.status == "failed" and answer.error is not None
        assert answer.error.code == ErrorCode.OVER_LIMIT
        assert (answer.batch_id, answer.batch_total) == ("B", 2)  # collect still counts it
        assert dict(answer.metadata) == {} and answer.text == ""
        assert "1000000" in answer.error.message and "message.max.bytes" in answer.error.message
        assert results["small"].status == "completed"
        assert not r.broker.on(DEAD)


def test_a_dead_letter_over_the_limit_drops_the_original_headers_but_keeps_its_bytes() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        value = b"{not json"
        r.broker.append(0, value, [("trace", incompressible(1_200_000).encode())])
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.broker.on(DEAD)) == 1 and r.settled(set()), "a dead letter")

        [letter] = r.broker.on(DEAD)
        assert letter.value == value
        headers = headers_of(letter)
        assert "trace" not in headers
        assert headers["error-code"] == b"4001" and headers["source"] == b"requests/0/0"


def test_a_dead_letter_whose_bytes_cannot_fit_is_a_4003_record_naming_the_size() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        value = b"{" + incompressible(1_100_000).encode()
        r.broker.append(0, value, [("content-type", b"application/json")])
        r.broker.submit(0, "after", "still served")
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled({"after"}), "the next request answered")

        [letter] = r.broker.on(DEAD)
        assert not letter.value
        headers = headers_of(letter)
        assert headers["error-code"] == b"4003" and headers["source"] == b"requests/0/0"
        message = headers["error-message"]
        assert isinstance(message, bytes)
        assert str(len(value)) in message.decode() and b"1000000" in message
        assert b"4001" in message  # why it was dead-lettered in the first place
        assert r.answers() == Counter({"after": 1})


def test_a_custom_id_too_long_for_any_answer_is_dead_lettered_as_4003() -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        r.broker.submit(0, "x" * 1_100_000, "hi")  # the key alone is over the limit
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.broker.on(DEAD)) == 1 and r.settled(set()), "a dead letter")

        [letter] = r.broker.on(DEAD)
        headers = headers_of(letter)
        assert headers["error-code"] == b"4003" and b"custom_id" in (
            headers["error-message"] or b""
        )
        assert r.answers() == Counter()


@pytest.mark.parametrize("delivery", ["fake", "exactly_once", "at_least_once"])
def test_a_result_over_the_results_topics_max_message_bytes_is_a_4003_answer(
    delivery: Delivery,
) -> None:
    # the broker takes larger records from librdkafka but would refuse this topic's batch
    # after the fact; the worker knows the topic's limit (read at start) and answers 4003
    with rig(loop_config(), GatedEngine(gated=False), delivery=delivery) as r:
        r.broker.topic_max[RESULTS] = 20_000
        r.broker.submit_request(
            0,
            InferenceRequest(
                custom_id="big", prompt="hi", metadata={"blob": incompressible(30_000)}
            ),
        )
        r.broker.submit(0, "small", "hello")
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled({"big", "small"}), "both answered and committed")

        results = {result.custom_id: result for result in r.results()}
        error = results["big"].error
        assert results["big"].status == "failed" and error is not None
        assert error.code == ErrorCode.OVER_LIMIT
        assert f"{RESULTS}'s max.message.bytes (20000)" in error.message
        assert results["small"].status == "completed"
