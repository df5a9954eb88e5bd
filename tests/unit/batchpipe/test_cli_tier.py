"""``batchpipe submit/run --tier``, ``status`` and ``list`` with a service tier (issue 50)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchpipe.cli import EXIT_USAGE, format_status, main
from batchpipe.collect import BatchStatus
from batchpipe.listing import format_listing


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


def test_status_and_list_show_the_tier() -> None:
    status = BatchStatus("b1", 10, 7, 1, "in_progress", 100, 50, 5, None, tier="flex")
    assert "  tier      flex" in format_status(status, None)
    assert json.loads(json.dumps(status.to_dict()))["batchpipe"] == {"tier": "flex"}
    assert format_listing([status]).endswith("  tier flex")
    unknown = BatchStatus("b2", 1, 0, 0, "in_progress", 0, 0, 0, None)
    assert "tier" not in format_status(unknown, None) and "batchpipe" not in unknown.to_dict()
