"""``batchpipe submit/run --tier``, ``status`` and ``list`` with a service tier (issue 50)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchpipe import Client, TierRefusedError
from batchpipe import client as client_module
from batchpipe.cli import EXIT_USAGE, format_status, main
from batchpipe.collect import BatchStatus
from batchpipe.listing import format_listing
from tests.unit.batchpipe.test_publish_pending import Producer
from worker.config import load_config
from worker.feeder.headers import tier_in
from worker.kafka import clients

#: bob's allowance is 0, everyone else's 0.2 (through "*")
SHARES = ["--set", "scheduling.priority_shares.bob=0", "--set", "scheduling.priority_shares.*=0.2"]


def test_a_tier_that_cannot_apply_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("{}\n")
    for command in ("submit", "run"):
        flex = ["--tier", "flex", "--set", "scheduling.fair=false"]
        assert main([command, str(batch), *flex]) == EXIT_USAGE
        assert "--tier: applies with scheduling.fair only" in capsys.readouterr().err
        with pytest.raises(SystemExit) as refused:
            main([command, str(batch), "--tier", "express"])
        assert refused.value.code == EXIT_USAGE
        assert "invalid choice: 'express'" in capsys.readouterr().err


def test_priority_from_a_key_without_allowance_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("{}\n")  # invalid: a command that reads it says so instead
    for command in ("submit", "run"):
        refused = [command, str(batch), "--tier", "priority", "--key", "bob", *SHARES]
        assert main(refused) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "--tier: 'priority' is refused for key 'bob'" in err, err
        assert "allowance is 0 (scheduling.priority_shares['bob'] = 0)" in err, err
        starred = [command, str(batch), "--tier", "priority", "--key", "dave"]
        assert main([*starred, "--set", "scheduling.priority_shares.*=0"]) == EXIT_USAGE
        assert "(scheduling.priority_shares['*'] = 0)" in capsys.readouterr().err
        # an allowance above 0, or another tier: past the check, to the file's own error
        for allowed in (["--key", "carol"], ["--key", "bob", "--tier", "default"]):
            args = [command, str(batch), "--tier", "priority", *SHARES, *allowed]
            assert main(args) == EXIT_USAGE
            err = capsys.readouterr().err
            assert "line 1" in err and "--tier" not in err, err


def test_the_client_refuses_priority_for_a_key_without_allowance_and_publishes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = Producer()
    monkeypatch.setattr(clients, "producer", lambda *a, **k: producer.configured(k["extra"]))
    monkeypatch.setattr(clients, "ensure_topics", lambda *a, **k: None)
    monkeypatch.setattr(client_module, "ensure_pending", lambda *a, **k: None)
    sets = ["scheduling.priority_shares.bob=0", "scheduling.priority_shares.*=0.2"]
    client = Client(load_config(sets=sets, environ={}))
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    rows: list[dict[str, Any]] = [
        {"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": body}
    ]
    with pytest.raises(TierRefusedError, match=r"^tier: 'priority' is refused for key 'bob'"):
        client.submit(rows, "b1", key="bob", tier="priority")
    assert producer.records == []
    client.submit(rows, "b2", key="carol", tier="priority")
    client.submit(rows, "b3", key="bob", tier="flex")
    assert [tier_in(h) for _, _, value, h in producer.records if value is not None] == [
        "priority",
        "flex",
    ]


def test_status_and_list_show_the_tier() -> None:
    status = BatchStatus("b1", 10, 7, 1, "in_progress", 100, 50, 5, None, tier="flex")
    assert "  tier      flex" in format_status(status, None)
    assert json.loads(json.dumps(status.to_dict()))["batchpipe"] == {"tier": "flex"}
    assert format_listing([status]).endswith("  tier flex")
    unknown = BatchStatus("b2", 1, 0, 0, "in_progress", 0, 0, 0, None)
    assert "tier" not in format_status(unknown, None) and "batchpipe" not in unknown.to_dict()
