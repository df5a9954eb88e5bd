"""A cap given to ``batchpipe run`` or ``Client.collect`` (:func:`given_cap`) and its
follower (:class:`CapWatch`): the spend counted as serve counts it, the ``capped`` stop
announced once, when the cap is reached with lines still to come."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import batchpipe
from batchpipe.caps import Cap, CapWatch, given_cap
from worker.errors import ErrorCode
from worker.kafka.cancellations import Stop

PRICES = {"echo": {"prompt_per_1m": 2.0, "completion_per_1m": 8.0}}


@dataclass
class Tally:
    batch_id: str = "b1"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    complete: bool = False


def test_a_given_cap_is_read_and_priced_as_serve_reads_one() -> None:
    cap = given_cap(400, 0.5, "echo", PRICES)
    assert cap == Cap(max_tokens=400, max_cost_usd=0.5, prompt_per_1m=2.0, completion_per_1m=8.0)
    assert not given_cap(None, None, "echo", {}).limits
    assert given_cap("7", None, None, {}).max_tokens == 7  # several models: tokens still count


@pytest.mark.parametrize(
    ("tokens", "cost", "model", "param"),
    [
        (0, None, "echo", "max_tokens"),
        (True, None, "echo", "max_tokens"),
        (10**12 + 1, None, "echo", "max_tokens"),
        (None, 0, "echo", "max_cost_usd"),
        (None, float("inf"), "echo", "max_cost_usd"),
        (None, 1.0, "unpriced", "max_cost_usd"),
        (None, 1.0, None, "max_cost_usd"),
    ],
)
def test_a_given_cap_out_of_bounds_names_its_field(
    tokens: object, cost: object, model: str | None, param: str
) -> None:
    with pytest.raises(batchpipe.CapError) as raised:  # the package exports it
        given_cap(tokens, cost, model, PRICES)
    assert raised.value.param == param
    assert str(raised.value).startswith(f"{param}: ")


def test_the_watch_announces_the_capped_stop_once_at_the_cap() -> None:
    stops: list[Stop] = []
    watch = CapWatch(Cap(max_tokens=100), stops.append)
    tally = Tally(prompt_tokens=60, completion_tokens=39)
    watch.see(tally)
    assert stops == [] and watch.summary(tally) is None
    tally.completion_tokens = 40  # 100: the cap, reached
    watch.see(tally)
    tally.prompt_tokens = 500  # over, again: no second stop
    watch.see(tally)
    assert [(s.batch_id, s.reason, s.code) for s in stops] == [
        ("b1", "capped", ErrorCode.BATCH_CAP_REACHED)
    ]
    assert watch.summary(tally) == (
        "the batch reached its token cap of 100 (540 tokens spent); the lines not run are "
        "in the error file with code 4008 batch_cap_reached"
    )


def test_the_watch_counts_cost_at_the_models_price() -> None:
    stops: list[Stop] = []
    watch = CapWatch(given_cap(None, 0.001, "echo", PRICES), stops.append)
    tally = Tally(prompt_tokens=100, completion_tokens=99)  # 0.000992 USD
    watch.see(tally)
    assert stops == []
    tally.completion_tokens = 100  # 0.001 USD
    watch.see(tally)
    assert len(stops) == 1
    summary = watch.summary(tally)
    assert summary is not None and "cost cap of 0.001 USD (0.0010 USD spent)" in summary


def test_a_batch_complete_at_its_cap_is_not_stopped() -> None:
    stops: list[Stop] = []
    watch = CapWatch(Cap(max_tokens=10), stops.append)
    tally = Tally(prompt_tokens=10, complete=True)  # its last answer reached it: nothing to stop
    watch.see(tally)
    assert stops == [] and watch.summary(tally) is None
