"""Races between requests and the lifecycle (issue 24, defects 1 and 5)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from batchpipe.api import lifecycle as lifecycle_module
from batchpipe.api.assemble import Assembled
from batchpipe.api.lifecycle import Lifecycle
from batchpipe.api.records import BatchRecord, Counts, Usage
from batchpipe.api.state import StaleRecord
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    FakeLog,
    QuietLifecycle,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
    until,
)


def test_deleting_a_file_and_creating_its_batch_at_once_never_both_succeed(
    tmp_path: Path,
) -> None:
    """Defect 1: both requests pass their checks, then both writes meet (a barrier in the
    broker): without one lock over check and write both answered 200."""
    log = FakeLog()
    svc = services(unit_config(tmp_path), log=log)
    with client(svc) as http:
        file = stored_file(svc)
        meet = threading.Barrier(2, timeout=2)

        def gate(key: str) -> None:
            # broken when the other write waits for this one's lock: it comes after
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait()

        log.gate = gate
        answers: dict[str, int] = {}
        body = {
            "input_file_id": file.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        calls = {
            "create": lambda: http.post("/v1/batches", headers=ALICE, json=body),
            "delete": lambda: http.delete(f"/v1/files/{file.id}", headers=ALICE),
        }
        threads = [
            threading.Thread(target=lambda n=n, c=c: answers.__setitem__(n, c().status_code))
            for n, c in calls.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        log.gate = None
        assert sorted(answers.values()) in ([200, 404], [200, 409]), answers
        batches = svc.state.batches("alice")
        assert (answers["create"] == 200) == bool(batches)
        assert (answers["delete"] == 200) == (svc.state.file(file.id) is None)


def _assembled(*args: Any, **kwargs: Any) -> Assembled:
    return Assembled(Counts(2, 0, 2), Usage(), None, None)


def test_a_batch_whose_input_is_gone_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 1: a cancelled batch whose input file vanished used to abort every step,
    so older batches of every key stopped progressing."""
    monkeypatch.setattr(lifecycle_module, "assemble", _assembled)
    svc = services(unit_config(tmp_path, cancel_grace_s=0))
    lifecycle = svc.lifecycle
    assert isinstance(lifecycle, Lifecycle)
    old = stored_batch(svc, stored_file(svc, "bob"), status="cancelling", cancelling_at=1)
    broken_file = stored_file(svc, "alice")
    # newer: steps take the broken batch first, as they take the newest first
    broken = stored_batch(
        svc, broken_file, status="cancelling", cancelling_at=1, created_at=old.created_at + 1
    )
    svc.store.delete(broken_file.id)
    lifecycle._step()
    ended = svc.state.batch(old.id)
    failed = svc.state.batch(broken.id)
    assert ended is not None and ended.status == "cancelled"
    assert failed is not None and failed.status == "failed"
    assert failed.errors[0]["code"] == "input_file_missing"
    svc.state.close()


@pytest.mark.parametrize("status", ["finalizing", "completed", "failed", "expired", "cancelled"])
def test_a_batch_that_is_finishing_or_ended_is_not_cancelled(tmp_path: Path, status: str) -> None:
    """Defect 5: the state is decided under the lifecycle's lock; a finished batch is a 409
    and stays as it was."""
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        batch = stored_batch(svc, stored_file(svc), status=status)
        kept, cancelled = svc.lifecycle.cancel(batch.id)
        assert (kept.status, cancelled) == (status, False)
        answer = http.post(f"/v1/batches/{batch.id}/cancel", headers=ALICE)
        assert (answer.status_code, answer.json()["error"]["code"]) == (
            409,
            "batch_not_cancellable",
        )
        after = svc.state.batch(batch.id)
        assert after is not None and (after.status, after.version) == (status, batch.version)
        assert isinstance(svc.lifecycle, QuietLifecycle) and svc.lifecycle.stops == []


def test_cancel_cancels_once_and_a_retry_answers_the_same(tmp_path: Path) -> None:
    """Defect 5: in_progress → cancelling with one stop; cancelling again is a 200 that
    changes nothing, as docs/api.md says."""
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        batch = stored_batch(svc, stored_file(svc), status="in_progress")
        first = http.post(f"/v1/batches/{batch.id}/cancel", headers=ALICE)
        again = http.post(f"/v1/batches/{batch.id}/cancel", headers=ALICE)
        assert (first.status_code, first.json()["status"]) == (200, "cancelling")
        assert (again.status_code, again.json()["status"]) == (200, "cancelling")
        assert isinstance(svc.lifecycle, QuietLifecycle)
        lifecycle = svc.lifecycle
        assert until(lambda: [s.batch_id for s in lifecycle.stops] == [batch.id])
        after = svc.state.batch(batch.id)
        assert after is not None and after.version == batch.version + 1


def test_a_cancel_meeting_another_replicas_change_decides_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by reading: a write over a version another replica replaced is refused
    (StaleRecord); a cancel then decides again on what that replica wrote, and a second
    refusal is a 409 to retry, never a 500."""
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        batch = stored_batch(svc, stored_file(svc), status="in_progress")
        real_put = svc.state.put_batch
        refusals = [StaleRecord("another replica wrote first")]

        def put_batch(record: BatchRecord) -> BatchRecord:
            if refusals:
                raise refusals.pop()
            return real_put(record)

        monkeypatch.setattr(svc.state, "put_batch", put_batch)
        retried = http.post(f"/v1/batches/{batch.id}/cancel", headers=ALICE)
        assert (retried.status_code, retried.json()["status"]) == (200, "cancelling")
        other = stored_batch(svc, stored_file(svc), status="in_progress")
        refusals.extend([StaleRecord("again"), StaleRecord("and again")])
        refused = http.post(f"/v1/batches/{other.id}/cancel", headers=ALICE)
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "conflict")
