"""Mismatched fair-share settings never stall silently (issue 33, item 5): ``serve`` with
``scheduling.fair`` and no feeder alive says so on ``/readyz`` and ends a batch that had no
answer in 60 s ``failed``, naming the setting. Before: the batch stayed ``in_progress``,
0 of 20 answered after 90 s, and nothing said why."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from batchpipe.api.feederwatch import NO_FEEDER_CODE, NO_FEEDER_S, FeederWatch
from batchpipe.api.lifecycle import Lifecycle
from tests.unit.batchpipe.api.fakes import client, services, stored_batch, stored_file, unit_config
from worker.config import Config
from worker.feeder.state import alive, alive_at


def fair(tmp_path: Path, on: bool = True) -> Config:
    config = unit_config(tmp_path)
    return replace(config, scheduling=replace(config.scheduling, fair=on))


def test_the_watch_says_why_once_no_heartbeat_came_for_a_minute(tmp_path: Path) -> None:
    watch = FeederWatch(fair(tmp_path))
    started = time.time()
    assert watch.stalled(started + 1) is None  # a minute's grace from the start
    why = watch.stalled(started + NO_FEEDER_S + 1)
    assert why is not None and "scheduling.fair" in why and ".pending" in why
    watch._beat = started + NO_FEEDER_S  # a heartbeat came
    assert watch.stalled(started + NO_FEEDER_S + 1) is None
    assert FeederWatch(fair(tmp_path, on=False)).stalled(started + 3600) is None
    assert alive_at(alive(1234.0)) == 1234.0 and alive_at(b"17") is None


def test_a_batch_without_a_feeder_ends_failed_naming_the_setting(tmp_path: Path) -> None:
    svc = services(fair(tmp_path))
    with client(svc) as api:
        now = time.time()
        waited = stored_batch(
            svc, stored_file(svc), status="in_progress", in_progress_at=int(now) - 61
        )
        fresh = stored_batch(svc, stored_file(svc), status="in_progress", in_progress_at=int(now))
        svc.lifecycle.feeders._since = now - 120  # no heartbeat since the server started
        body = api.get("/readyz").json()
        assert body["ready"] is True and "no feeder alive" in body["warning"]
        for batch in (waited, fresh):
            Lifecycle._advance(svc.lifecycle, batch, now)
        failed = svc.state.batch(waited.id)
        assert failed is not None and failed.status == "failed"
        assert failed.errors[0]["code"] == NO_FEEDER_CODE
        assert failed.errors[0]["param"] == "scheduling.fair"
        still = svc.state.batch(fresh.id)
        assert still is not None and still.status == "in_progress"  # not a minute yet
