"""Partial results through the official SDK against ``batchpipe serve`` (the defaults) on
the embedded broker with a real worker: a running batch read three times gives a growing,
duplicate-free prefix of its final files, and the final files are the last read plus the
rest (issue 50, part 1); a cursor of a server holds on the server started after it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from batchpipe.api.answerlog import is_error_line
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_cancel_restart import slow
from tests.integration.api.test_sdk_echo import WAIT_S, batch_file, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration

LINES = 2_000


def paced(config: Config) -> Config:
    """An echo engine slow enough that a 2,000-line batch runs for seconds (~10 tokens a
    reply, 10 ms a decoding step, 32 requests a step)."""
    return replace(config, engine=replace(config.engine, simulated_token_s=0.01))


def read_partial(client: OpenAI, batch_id: str, after: str | None) -> httpx.Response:
    """One page of ``GET /v1/batches/{id}/partial`` through the SDK's generic call."""
    params = {"limit": 10_000} | ({} if after is None else {"after": after})
    return client.get(
        f"/batches/{batch_id}/partial", cast_to=httpx.Response, options={"params": params}
    )


def answered(client: OpenAI, batch_id: str, at_least: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        counts = client.batches.retrieve(batch_id).request_counts
        if counts is not None and counts.completed + counts.failed >= at_least:
            return
        assert time.monotonic() < deadline, f"fewer than {at_least} answered"
        time.sleep(0.05)


def file_bytes(client: OpenAI, file_id: str | None) -> bytes:
    return b"" if file_id is None else client.files.content(file_id).content


def test_partial_reads_are_a_growing_prefix_of_the_final_files(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = paced(api_config)
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", LINES).open("rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        cursor: str | None = None
        read = b""
        for at_least in (100, 500, 900):
            answered(client, batch.id, at_least)
            page = read_partial(client, batch.id, cursor)
            assert page.status_code == 200
            assert page.headers["x-batchpipe-batch-status"] == "in_progress"
            assert page.headers["x-batchpipe-done"] == "false"
            assert page.content, f"nothing new after {len(read.splitlines())} lines"
            read += page.content
            cursor = page.headers["x-batchpipe-cursor"]
        ids = [json.loads(line)["custom_id"] for line in read.splitlines()]
        # the counts grow as answers are read, the log at the end of each read step
        # (0.2 s at most): the pages may lag the counts by that step's answers
        assert len(ids) == len(set(ids)) > 500
        assert len(ids) < LINES, "the batch ended before the third read: pace it slower"

        done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed", done
        rest = read_partial(client, batch.id, cursor)
        assert rest.headers["x-batchpipe-done"] == "true"
        everything = read + rest.content
        output = file_bytes(client, done.output_file_id)
        errors = file_bytes(client, done.error_file_id)
        lines = everything.splitlines(keepends=True)
        # the final files are the last partial read plus the rest, byte for byte
        assert b"".join(x for x in lines if not is_error_line(x)) == output
        assert b"".join(x for x in lines if is_error_line(x)) == errors
        assert output.startswith(b"".join(x for x in read.splitlines(True) if not is_error_line(x)))
        assert sorted(json.loads(x)["custom_id"] for x in lines) == sorted(
            f"req-{i}" for i in range(LINES)
        )


def test_a_cursor_holds_across_a_server_restart(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    config = slow(api_config)  # two requests an engine batch, ~0.2 s each: 60 take ~6 s
    with running_worker(config):
        with serve(config) as first:
            client = sdk(first)
            file = client.files.create(
                file=batch_file(tmp_path / "in.jsonl", 60).open("rb"), purpose="batch"
            )
            batch = client.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            answered(client, batch.id, 6)
            before = read_partial(client, batch.id, None)
            assert before.content and before.headers["x-batchpipe-done"] == "false"
        with serve(config) as second:  # reads the batch's results again, from the start
            client = sdk(second)
            done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
            assert done.status == "completed", done
            rest = read_partial(client, batch.id, before.headers["x-batchpipe-cursor"])
            assert rest.headers["x-batchpipe-done"] == "true"
            output = file_bytes(client, done.output_file_id)
    assert before.content + rest.content == output  # no line again, none moved
    assert len(output.splitlines()) == 60
