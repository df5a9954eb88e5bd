"""Kafka unreachable or stalled (issue 24, defect 6): /readyz fails, requests that need
Kafka are 503 with Retry-After at once, lookups that need no Kafka still answer, and the
health probes never queue behind requests waiting on Kafka."""

from __future__ import annotations

import threading
from pathlib import Path

from batchpipe.api.state import DOWN_AFTER_S
from tests.unit.batchpipe.api.fakes import (
    ALICE,
    LINE,
    FakeLog,
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
    until,
)

_BATCH = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


def test_kafka_down_is_not_ready_and_writes_are_503s_at_once(tmp_path: Path) -> None:
    log = FakeLog()
    svc = services(unit_config(tmp_path), log=log)
    with client(svc) as http:
        file = stored_file(svc)
        batch = stored_batch(svc, file, status="in_progress")
        unused = stored_file(svc)
        log.down = True
        assert until(lambda: http.get("/readyz").status_code == 503, DOWN_AFTER_S + 10)
        assert http.get("/readyz").json()["reason"] == "Kafka unreachable"
        assert http.get("/healthz").status_code == 200  # alive: a restart would not help
        refused = [
            http.post("/v1/batches", headers=ALICE, json={**_BATCH, "input_file_id": file.id}),
            http.post(
                "/v1/files",
                headers=ALICE,
                files={"file": ("a.jsonl", LINE)},
                data={"purpose": "batch"},
            ),
            http.post(f"/v1/batches/{batch.id}/cancel", headers=ALICE),
            http.delete(f"/v1/files/{unused.id}", headers=ALICE),
            http.get("/v1/batches/batch_nothing", headers=ALICE),  # a miss must ask Kafka
        ]
        for answer in refused:
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"].isdigit()
            assert answer.json()["error"]["type"] == "server_error"
        # what this replica holds needs no Kafka
        assert http.get(f"/v1/files/{file.id}", headers=ALICE).status_code == 200
        assert http.get(f"/v1/batches/{batch.id}", headers=ALICE).json()["status"] == "in_progress"
        assert len(http.get("/v1/batches", headers=ALICE).json()["data"]) == 1
        log.down = False
        assert until(lambda: http.get("/readyz").status_code == 200, DOWN_AFTER_S + 10)


def test_health_probes_answer_while_every_worker_thread_waits_on_kafka(tmp_path: Path) -> None:
    """45 creates stalled inside Kafka writes hold all 40 worker threads; /healthz and
    /readyz used to wait for one of them."""
    log = FakeLog()
    svc = services(unit_config(tmp_path), log=log)
    with client(svc) as http:
        files = [stored_file(svc) for _ in range(45)]
        release = threading.Event()
        entered = threading.Semaphore(0)
        real_guard = svc.state.guard

        def counting_guard(object_id: str) -> threading.Lock:
            entered.release()
            return real_guard(object_id)

        svc.state.guard = counting_guard  # type: ignore[method-assign]

        def stall(key: str) -> None:
            release.wait(60)

        log.gate = stall
        creates = [
            threading.Thread(
                target=http.post,
                args=("/v1/batches",),
                kwargs={"headers": ALICE, "json": {**_BATCH, "input_file_id": f.id}},
            )
            for f in files
        ]
        for thread in creates:
            thread.start()
        for _ in range(40):  # every worker thread is inside a create
            assert entered.acquire(timeout=30)
        probes: dict[str, int] = {}
        prober = threading.Thread(
            target=lambda: probes.update(
                healthz=http.get("/healthz").status_code, readyz=http.get("/readyz").status_code
            )
        )
        prober.start()
        prober.join(20)
        answered = not prober.is_alive()
        release.set()
        for thread in creates:
            thread.join(60)
        prober.join(60)
        assert answered, "the probes waited behind the stalled creates"
        assert probes == {"healthz": 200, "readyz": 200}
