"""Cancel for real, and a server restart in the middle of a batch, through the official
SDK; the worker's echo engine paces itself so the batch is still running when it matters."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_sdk_echo import WAIT_S, batch_file, lines_of, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration


def slow(config: Config) -> Config:
    """Batches of two, each taking a few tenths of a second."""
    batching = replace(config.batching, max_batch_size=2, adaptive=False, dedup=False)
    engine = replace(config.engine, simulated_token_s=0.03)
    return replace(config, batching=batching, engine=engine)


def test_cancel_keeps_finished_results_and_answers_the_rest(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = slow(api_config)
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", 40).open("rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + WAIT_S
        while True:
            running = client.batches.retrieve(batch.id)
            counts = running.request_counts
            if counts is not None and counts.completed >= 2:
                break
            assert time.monotonic() < deadline, f"no progress: {running}"
            time.sleep(0.1)
        assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
        done = wait_for(client, batch.id, {"cancelled"})
        assert done.cancelled_at is not None and done.request_counts is not None
        counts = done.request_counts
        output = lines_of(client, done.output_file_id)
        errors = lines_of(client, done.error_file_id)
        assert counts.total == 40 and counts.completed + counts.failed == 40
        assert len(output) == counts.completed >= 2
        assert len(errors) == counts.failed >= 1
        codes = {json.dumps(line["error"]) for line in errors}
        assert all('"4005"' in code for code in codes), codes
        ids = [line["custom_id"] for line in output + errors]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(40))  # type: ignore[type-var]


def test_restart_mid_batch_loses_nothing_and_lists_page(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = slow(api_config)
    with running_worker(config):
        with serve(config) as first:
            client = sdk(first)
            small = client.files.create(
                file=batch_file(tmp_path / "s.jsonl", 1, "s").open("rb"), purpose="batch"
            )
            older = [
                client.batches.create(
                    input_file_id=small.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                ).id
                for _ in range(2)
            ]
            file = client.files.create(
                file=batch_file(tmp_path / "in.jsonl", 20).open("rb"), purpose="batch"
            )
            batch = client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_for(client, batch.id, {"in_progress"})
        with serve(config) as second:
            client = sdk(second)
            done = wait_for(client, batch.id, {"completed", "failed", "cancelled", "expired"})
            assert done.status == "completed"
            output = lines_of(client, done.output_file_id)
            assert sorted(line["custom_id"] for line in output) == sorted(  # type: ignore[type-var]
                f"req-{i}" for i in range(20)
            )
            first_page = client.batches.list(limit=2)
            assert first_page.has_more and len(first_page.data) == 2
            listed = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after`
            assert listed == [batch.id, *reversed(older)]
