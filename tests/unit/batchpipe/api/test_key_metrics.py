"""Per-key series on the API's /metrics (issue 23): queued and answered requests and
tokens, labelled by the key's owner, for the owners of the keys file only."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from batchpipe.api.records import Counts, Usage
from tests.unit.batchpipe.api.fakes import (
    client,
    services,
    stored_batch,
    stored_file,
    unit_config,
)


def test_queued_and_answered_per_key(tmp_path: Path) -> None:
    svc = services(unit_config(tmp_path))
    with client(svc) as http:
        stored_batch(
            svc, stored_file(svc, lines=4), status="in_progress", counts=Counts(4, 1, 0), tokens=400
        )
        stored_batch(
            svc,
            stored_file(svc, lines=2),
            status="completed",
            counts=Counts(2, 1, 1),
            usage=Usage(10, 20),
            tokens=99,
        )
        stored_batch(svc, stored_file(svc, "carol"), status="in_progress")  # not in the keys
        text = http.get("/metrics").text
    samples = {
        (s.name, s.labels.get("key")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("batchpipe_api_queued", "batchpipe_api_answered"))
    }
    assert samples == {
        ("batchpipe_api_queued_requests", "alice"): 3,
        ("batchpipe_api_queued_tokens", "alice"): 300,
        ("batchpipe_api_answered_requests_total", "alice"): 3,
        ("batchpipe_api_answered_tokens_total", "alice"): 30,
        ("batchpipe_api_queued_requests", "bob"): 0,
        ("batchpipe_api_queued_tokens", "bob"): 0,
        ("batchpipe_api_answered_requests_total", "bob"): 0,
        ("batchpipe_api_answered_tokens_total", "bob"): 0,
    }
