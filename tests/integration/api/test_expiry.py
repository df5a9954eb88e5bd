"""Expiry through the official SDK with a real broker and an echo worker (issue 26).

OpenAI's windows are an hour at least, so the server's clock
(:func:`batchpipe.api.retention.now`, which every expiry decision reads) is moved instead
of waiting: the input file expires while its batch runs (hidden at once, kept whole until
the batch ends, then removed from the store), the batch still completes and stays
readable, and its output goes on its own schedule (``output_expires_after``). The S3
store runs the same scenario in test_s3_store.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from batchpipe.api.app import Server
from tests.integration.api.conftest import Clock, Serve, sdk
from tests.integration.api.test_cancel_restart import slow
from tests.integration.api.test_sdk_echo import WAIT_S, batch_file, lines_of, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = pytest.mark.integration

HOUR = 3600


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}"
        time.sleep(0.1)


def _gone(client: OpenAI, file_id: str) -> bool:
    try:
        client.files.retrieve(file_id)
    except openai.NotFoundError:
        return True
    return False


def expiry_scenario(
    server: Server, clock: Clock, tmp_path: Path, stored: Callable[[], set[str]]
) -> None:
    """The scenario on a running server and worker; ``stored`` lists the store's objects."""
    client = sdk(server)
    source = batch_file(tmp_path / "in.jsonl", 40)
    file = client.files.create(
        file=source.open("rb"),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": HOUR},
    )
    assert file.expires_at == file.created_at + HOUR
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 2 * HOUR},
    )
    clock.shift = HOUR + 1  # the input expires while the (paced) batch runs
    assert _gone(client, file.id)
    assert file.id not in {f.id for f in client.files.list()}
    with pytest.raises(openai.NotFoundError):
        client.files.content(file.id)
    assert client.batches.retrieve(batch.id).status in ("validating", "in_progress")
    assert file.id in stored()  # kept whole for the batch that reads it

    done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
    assert done.status == "completed", done
    assert len(lines_of(client, done.output_file_id)) == 40
    _until(lambda: file.id not in stored(), "the expired input removed once its batch ended")

    output = client.files.retrieve(done.output_file_id or "")
    assert output.expires_at == output.created_at + 2 * HOUR
    assert done.output_file_id in stored()
    clock.shift = output.expires_at - time.time() + 1
    _until(lambda: done.output_file_id not in stored(), "the output removed on its schedule")
    assert _gone(client, output.id)
    again = client.batches.retrieve(batch.id)  # the batch outlives both files
    assert (again.status, again.input_file_id, again.output_file_id) == (
        "completed",
        file.id,
        output.id,
    )
    assert [b.id for b in client.batches.list()] == [batch.id]


def test_files_expire_on_schedule_and_the_batch_survives(
    api_config: Config, serve: Serve, clock: Clock, tmp_path: Path
) -> None:
    config = slow(api_config)
    objects = Path(config.api.store_dir) / "objects"
    with serve(config) as server, running_worker(config):
        expiry_scenario(server, clock, tmp_path, lambda: {p.name for p in objects.iterdir()})


def test_a_deleted_input_never_breaks_its_ended_batch(
    api_config: Config, serve: Serve, tmp_path: Path
) -> None:
    with serve(api_config) as server, running_worker(api_config):
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "in.jsonl", 3).open("rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_for(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed"
        assert client.files.delete(file.id).deleted
        again = client.batches.retrieve(batch.id)
        assert (again.status, again.input_file_id) == ("completed", file.id)
        assert len(lines_of(client, again.output_file_id)) == 3
        assert [b.id for b in client.batches.list()] == [batch.id]
