"""Service tiers through the official SDK against ``batchpipe serve`` with the defaults,
on the embedded broker with a real worker (issue 50's done-when; bench/tiers.py runs the
same rounds and writes bench/results/tiers.json).

Echo at 10 ms a token (priority; 30 ms for flex, bench/tiers.py says why) and 4 tokens
an answer; in the priority test key ``alice`` weighs 100
(``api.key_weights``), so without its tier bob's 50-line batch would be fed 1/101 of the
fleet after its first slice: the priority test fails if the tier is not honoured, as the
flex test (both keys weigh 1) does if flex takes its fair half. Each bound is measured
against the same run's time alone; the priority bound compares the best of four rounds
of each (serve's publish now and then adds 0.5 s to a batch, loaded or alone).
``priority`` from a key whose allowance (``scheduling.priority_shares``) is 0 is a 400
naming ``metadata.batchpipe_tier``, and nothing of it is published.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import openai
import pytest

from bench.tiers import (
    ALICE_WEIGHT,
    FLEX_TOKEN_S,
    PRIORITY_TOKEN_S,
    flex_run,
    priority_rounds,
    tier_config,
)
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_http_errors import published
from tests.integration.api.test_sdk_echo import batch_file, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration


def test_a_priority_batch_is_not_held_back_by_a_full_fleet(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = tier_config(api_config, PRIORITY_TOKEN_S, ALICE_WEIGHT)
    assert config.scheduling.fair and not config.scheduling.priority_shares  # the defaults
    with serve(config) as server, running_worker(config):
        seen = priority_rounds(sdk(server), sdk(server, "sk-bob"), tmp_path, rounds=4)
    print(seen)  # pytest -s
    assert seen["best_ratio"] <= 1.5, seen


def test_a_flex_batch_gives_way_to_a_default_one(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = tier_config(api_config, FLEX_TOKEN_S)
    with serve(config) as server, running_worker(config):
        alice, bob = sdk(server), sdk(server, "sk-bob")
        seen = flex_run(alice, bob, tmp_path)
    print(seen)  # pytest -s
    assert seen["flex_ended_after_s"] > 0, seen
    assert seen["throughput_kept"] >= 0.95, seen


def test_the_tier_is_shown_and_a_bad_one_is_a_400_naming_the_field(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    with serve(api_config) as server, running_worker(api_config):
        client = sdk(server)
        uploaded = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", 3).open("rb"), purpose="batch"
        )
        for bad in ("express", "PRIORITY", ""):
            with pytest.raises(openai.BadRequestError) as refused:
                client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                    metadata={"batchpipe_tier": bad},
                )
            assert refused.value.param == "metadata.batchpipe_tier", refused.value
            assert "priority, default, flex" in str(refused.value)
        made = client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"batchpipe_tier": "flex"},
        )
        plain = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert (made.model_extra or {})["batchpipe"]["tier"] == "flex"
        assert (plain.model_extra or {})["batchpipe"]["tier"] == "default"
        assert wait_for(client, made.id, {"completed"}, 120).status == "completed"
        listed = {b.id: (b.model_extra or {})["batchpipe"]["tier"] for b in client.batches.list()}
        assert listed[made.id] == "flex" and listed[plain.id] == "default"


def test_priority_from_a_key_without_allowance_is_a_400_and_nothing_is_published(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    scheduling = replace(api_config.scheduling, priority_shares={"bob": 0.0})
    config = replace(api_config, scheduling=scheduling)
    with serve(config) as server, running_worker(config):
        alice, bob = sdk(server), sdk(server, "sk-bob")
        path = batch_file(tmp_path / "in.jsonl", 3)
        bobs = bob.files.create(file=path.open("rb"), purpose="batch")
        before = published(config)
        with pytest.raises(openai.BadRequestError) as refused:
            bob.batches.create(
                input_file_id=bobs.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"batchpipe_tier": "priority"},
            )
        assert refused.value.param == "metadata.batchpipe_tier", refused.value
        assert "allowance is 0 (scheduling.priority_shares['bob'] = 0)" in str(refused.value)
        assert list(bob.batches.list()) == [] and published(config) == before
        # alice's allowance is the default, 0.5: her priority batch runs as priority
        alices = alice.files.create(file=path.open("rb"), purpose="batch")
        made = alice.batches.create(
            input_file_id=alices.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"batchpipe_tier": "priority"},
        )
        assert (made.model_extra or {})["batchpipe"]["tier"] == "priority"
        done = wait_for(alice, made.id, {"completed", "failed"}, 120)
        assert done.status == "completed" and done.request_counts is not None, done
        assert done.request_counts.completed == 3, done
        assert list(bob.batches.list()) == []  # the refused batch never appeared
