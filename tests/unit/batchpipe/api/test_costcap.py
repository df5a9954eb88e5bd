"""A cost cap per batch (issue 50): caps read from metadata and the key's defaults, a cap
that cannot be read a 400 naming the field with nothing stored, the spend counted from
the answers, and a batch that reaches its cap stopped on the cancel's path with reason
``capped`` (4008) and the cap named in ``errors.data``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from msgspec import structs
from prometheus_client.parser import text_string_to_metric_families

from batchpipe.api.costcap import Cap, CapError, batch_cap
from batchpipe.api.records import Usage
from batchpipe.cli.spend import spend_of, spend_text
from batchpipe.collect import BatchTally
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    QuietLifecycle,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
)
from tests.unit.batchpipe.api.test_records import BATCH
from worker.config import ConfigError, load_config
from worker.errors import ErrorCode
from worker.kafka.cancellations import Stop
from worker.loop.jobs import Identity, failed
from worker.wire.messages import Usage as WireUsage

_PRICES = {"echo": {"prompt_per_1m": 2.0, "completion_per_1m": 6.0}}


def _answer(batch_id: str, custom_id: str, prompt: int, completion: int) -> Any:
    answer = failed(custom_id, ErrorCode.ENGINE_FAILED, "x", identity=Identity("w", "echo"))
    # a completed answer's usage, as a worker counts it
    return structs.replace(
        answer,
        batch_id=batch_id,
        batch_total=100,
        status="completed",
        usage=WireUsage(prompt_tokens=prompt, completion_tokens=completion),
    )


def test_caps_from_metadata_and_key_defaults(tmp_path: Path) -> None:
    config = unit_config(
        tmp_path,
        prices=_PRICES,
        key_max_tokens={"alice": 5_000, "*": 100},
        key_max_cost_usd={"alice": 3.0},
    )
    cap = batch_cap(config, "alice", "echo", {})
    assert (cap.max_tokens, cap.max_cost_usd, cap.prompt_per_1m) == (5_000, 3.0, 2.0)
    lower = batch_cap(
        config, "alice", "echo", {"batchpipe_max_tokens": "120", "batchpipe_max_cost_usd": "2.5"}
    )
    assert (lower.max_tokens, lower.max_cost_usd) == (120, 2.5)
    assert batch_cap(config, "bob", "echo", {}).max_tokens == 100  # "*" for every other key
    free = batch_cap(unit_config(tmp_path), "bob", "other", {})
    assert free == Cap() and not free.limits
    # a key's cost cap and a model without a price: its cost cannot be counted
    with pytest.raises(CapError, match="has no price") as refused:
        batch_cap(config, "alice", "unpriced", {})
    assert (refused.value.param, refused.value.error_code) == ("input_file_id", "model_not_priced")


@pytest.mark.parametrize(
    ("metadata", "param", "says"),
    [
        ({"batchpipe_max_tokens": "many"}, "metadata.batchpipe_max_tokens", "whole number"),
        ({"batchpipe_max_tokens": "0"}, "metadata.batchpipe_max_tokens", "from 1 to"),
        ({"batchpipe_max_tokens": "-5"}, "metadata.batchpipe_max_tokens", "from 1 to"),
        ({"batchpipe_max_tokens": "1.5"}, "metadata.batchpipe_max_tokens", "whole number"),
        (
            {"batchpipe_max_tokens": "1" + "0" * 13},
            "metadata.batchpipe_max_tokens",
            "1000000000000",
        ),
        ({"batchpipe_max_tokens": "6000"}, "metadata.batchpipe_max_tokens", "this key's cap"),
        ({"batchpipe_max_cost_usd": "x"}, "metadata.batchpipe_max_cost_usd", "US dollars"),
        ({"batchpipe_max_cost_usd": "0"}, "metadata.batchpipe_max_cost_usd", "above 0"),
        ({"batchpipe_max_cost_usd": "nan"}, "metadata.batchpipe_max_cost_usd", "above 0"),
        ({"batchpipe_max_cost_usd": "inf"}, "metadata.batchpipe_max_cost_usd", "above 0"),
        ({"batchpipe_max_cost_usd": "1e9"}, "metadata.batchpipe_max_cost_usd", "1e+06"),
    ],
)
def test_a_cap_that_cannot_be_read_is_a_400_naming_it(
    tmp_path: Path, metadata: dict[str, str], param: str, says: str
) -> None:
    svc = services(unit_config(tmp_path, prices=_PRICES, key_max_tokens={"alice": 5_000}))
    with client(svc) as http:
        file = stored_file(svc)
        body = {"input_file_id": file.id, "endpoint": "/v1/chat/completions"}
        answer = http.post(
            "/v1/batches",
            headers=ALICE,
            json={**body, "completion_window": "24h", "metadata": metadata},
        )
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert says in error["message"]
        assert svc.state.batches("alice") == []  # nothing stored


def test_a_cost_cap_without_prices_is_a_400(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        file = stored_file(svc)
        answer = http.post(
            "/v1/batches",
            headers=ALICE,
            json={
                "input_file_id": file.id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"batchpipe_max_cost_usd": "2.50"},
            },
        )
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "metadata.batchpipe_max_cost_usd"
        assert "no price in api.prices" in error["message"]


def test_the_configuration_bounds_prices_and_key_caps() -> None:
    with pytest.raises(ConfigError, match="a cost cap needs prices"):
        load_config(None, sets=['api.key_max_cost_usd={"*": 5}'])
    for wrong in (
        'api.prices={"m": {"prompt_per_1m": -1, "completion_per_1m": 1}}',
        'api.prices={"m": {"prompt_per_1m": 1}}',
        'api.key_max_tokens={"alice": 0}',
        'api.key_max_cost_usd={"alice": 0}',
    ):
        with pytest.raises(ConfigError, match="api"):
            load_config(None, sets=[wrong])


def test_spend_counts_tokens_and_cost_against_the_caps() -> None:
    cap = Cap(max_tokens=1_000, max_cost_usd=0.01, prompt_per_1m=2.0, completion_per_1m=6.0)
    tally = BatchTally("b", 100)
    assert tally.add(_answer("b", "a", 300, 200))
    assert not tally.add(_answer("b", "a", 300, 200))  # a repeat counts once
    assert cap.reached(tally) is None
    assert cap.view(tally.prompt_tokens, tally.completion_tokens) == {
        "tokens": 500,
        "cost_usd": 0.0018,
        "max_tokens": 1_000,
        "max_cost_usd": 0.01,
        "cap_reached_at": None,
    }
    tally.add(_answer("b", "b", 300, 200))
    assert cap.reached(tally) == "metadata.batchpipe_max_tokens"  # 1,000 tokens: at the cap
    # in money: 2,000 completion tokens at 6 USD per million is 0.012 USD, over 0.01
    dear = replace(cap, max_tokens=None)
    pricey = BatchTally("c", 100)
    pricey.add(_answer("c", "a", 0, 2_000))
    assert dear.reached(pricey) == "metadata.batchpipe_max_cost_usd"
    assert (
        "cost cap of 0.01 USD (0.0120 USD spent)"
        in dear.error("metadata.batchpipe_max_cost_usd", pricey)["message"]
    )


def test_a_batch_at_its_cap_is_stopped_as_capped_and_ends_cancelled(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    lifecycle = svc.lifecycle
    assert isinstance(lifecycle, QuietLifecycle)
    file = stored_file(svc, lines=100)
    batch = stored_batch(svc, file, status="in_progress", cap=Cap(max_tokens=1_000))
    under = stored_batch(svc, file, status="in_progress", cap=Cap(max_tokens=10_000))
    lifecycle._step()  # the follower now counts both
    for target in (batch, under):
        tally = lifecycle.results.tally(target.id)
        assert tally is not None
        for i in range(3):
            tally.add(_answer(target.id, f"l{i}", 300, 100))
    lifecycle._step()
    stopped = svc.state.batch(batch.id)
    assert stopped is not None and stopped.status == "cancelling"
    assert stopped.cap is not None and stopped.cap.reached_at is not None
    assert [e["code"] for e in stopped.errors] == ["batch_cap_reached"]
    assert stopped.errors[0]["param"] == "metadata.batchpipe_max_tokens"
    assert "token cap of 1,000 (1,200 tokens spent)" in stopped.errors[0]["message"]
    assert [(s.batch_id, s.reason) for s in lifecycle.stops] == [(batch.id, "capped")]
    assert Stop(batch.id, "capped", 0).code == ErrorCode.BATCH_CAP_REACHED
    assert int(ErrorCode.BATCH_CAP_REACHED) == 4008
    running = svc.state.batch(under.id)
    assert running is not None and running.status == "in_progress"
    # the spend, live, in the batch object
    shown = svc.lifecycle.progress(stopped)[1]
    assert stopped.to_openai(usage=shown)["batchpipe"]["spend"]["tokens"] == 1_200


def test_spend_against_caps_per_key_on_metrics(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    priced = Cap(max_tokens=1_000, max_cost_usd=1.0, prompt_per_1m=2.0, completion_per_1m=6.0)
    with client(svc) as http:
        file = stored_file(svc, lines=10)
        stored_batch(svc, file, status="in_progress", cap=priced, usage=Usage(300, 100))
        stored_batch(svc, file, status="in_progress", cap=Cap(max_tokens=500))
        stored_batch(svc, file, status="cancelled", cap=replace(priced, reached_at=1))
        stored_batch(svc, file, status="in_progress")  # no cap: not counted
        text = http.get("/metrics").text
    samples = {
        (s.name, s.labels.get("key")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "cap" in s.name and s.labels.get("key") == "alice"
    }
    assert samples == {
        ("batchpipe_api_capped_batches", "alice"): 2,
        ("batchpipe_api_capped_spent_tokens", "alice"): 400,
        ("batchpipe_api_capped_max_tokens", "alice"): 1_500,
        ("batchpipe_api_capped_spent_usd", "alice"): 0.0012,
        ("batchpipe_api_cap_reached_total", "alice"): 1,
    }


def test_status_and_list_show_the_spend_against_the_cap() -> None:
    """``batchpipe status`` and ``list`` price the tokens they counted with the batch's
    record from serve's state topic; a batch without a record or a cap shows nothing."""
    status = BatchTally("b", 10).status(
        submitted_at=None, now=0.0, completion_window_s=None, price_per_1k=None
    )
    status = replace(status, prompt_tokens=20_000, completion_tokens=7_858)
    cap = Cap(max_tokens=26_556, max_cost_usd=2.5, prompt_per_1m=2.0, completion_per_1m=6.0)
    record = replace(BATCH, cap=cap)
    spend = spend_of(status, record)
    assert spend is not None and spend["tokens"] == 27_858
    assert spend_text(spend) == "27,858 of 26,556 tokens, 0.0871 of 2.5 USD"
    stopped = spend_of(status, replace(record, cap=cap.stopped(5)))
    assert stopped is not None
    assert spend_text(stopped).endswith("cap reached: the lines not run are answered 4008")
    assert spend_of(status, None) is None
    assert spend_of(status, replace(BATCH, cap=Cap(prompt_per_1m=1, completion_per_1m=1))) is None
