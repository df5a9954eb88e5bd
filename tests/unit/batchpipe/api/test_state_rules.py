"""The state topic's rules (issue 24, found by reading): versions never go backwards, and
a write the client was told failed never appears."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from batchpipe.api.records import BatchRecord
from batchpipe.api.state import StaleRecord
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    LINE,
    FakeLog,
    client,
    services,
    state_on,
    stored_batch,
    stored_file,
    unit_config,
    until,
)


def test_a_stale_change_is_refused_and_a_restart_reads_the_newest(tmp_path: Path) -> None:
    log = FakeLog()
    config = unit_config(tmp_path)
    svc = services(config, log=log)
    batch = stored_batch(svc, stored_file(svc), status="in_progress")
    svc.state.put_batch(replace(batch, status="completed"))
    with pytest.raises(StaleRecord):  # a replica that had not seen "completed"
        svc.state.put_batch(replace(batch, status="cancelling"))
    value = log.latest()[batch.key]  # what compaction keeps
    assert value is not None and BatchRecord.decode(value).status == "completed"
    svc.state.close()
    restarted = state_on(log, config)
    found = restarted.batch(batch.id)
    assert found is not None and found.status == "completed"
    restarted.close()


def test_a_reader_keeps_the_highest_version_whatever_the_order(tmp_path: Path) -> None:
    log = FakeLog()
    config = unit_config(tmp_path)
    svc = services(config, log=log)
    batch = stored_batch(svc, stored_file(svc), status="in_progress")
    newer = svc.state.put_batch(replace(batch, status="completed"))
    log.append(batch.key.encode(), batch.encode())  # a late write of version 2
    svc.state.close()
    restarted = state_on(log, config)
    found = restarted.batch(batch.id)
    assert found is not None and (found.status, found.version) == ("completed", newer.version)
    restarted.close()


@pytest.mark.parametrize("what", ["file", "batch"])
def test_a_create_told_failed_never_appears(tmp_path: Path, what: str) -> None:
    """The broker wrote the record but its acknowledgement was lost: the client gets a
    503, and the record is retracted before any reader can keep it."""
    log = FakeLog()
    config = unit_config(tmp_path)
    svc = services(config, log=log)
    with client(svc) as http:
        file = stored_file(svc)
        log.fail_next(KafkaError._MSG_TIMED_OUT, written=True)
        if what == "file":
            answer = http.post(
                "/v1/files",
                headers=ALICE,
                files={"file": ("a.jsonl", LINE)},
                data={"purpose": "batch"},
            )
        else:
            body = {
                "input_file_id": file.id,
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            }
            answer = http.post("/v1/batches", headers=ALICE, json=body)
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"].isdigit()
        written = [k for k, v in log.latest().items() if v is not None and k != file.key]
        assert until(lambda: all(log.latest()[k] is None for k in written))
        assert [f.id for f in svc.state.files("alice")] == [file.id]
        assert svc.state.batches("alice") == []
    restarted = state_on(log, config)
    assert [f.id for f in restarted.files("alice")] == [file.id]
    assert restarted.batches("alice") == []
    restarted.close()
