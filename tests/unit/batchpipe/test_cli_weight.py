"""``batchpipe submit --weight``: honoured with fair share, refused by name otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchpipe.cli import EXIT_USAGE, main


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--weight", "2", "--set", "scheduling.fair=false"], "--weight: applies with"),
        (["--key", "alice", "--set", "scheduling.fair=false"], "--key: applies with"),
        (["--weight", "0", "--set", "scheduling.fair=true"], "--weight: weight must be at least"),
        (["--weight", "1e9", "--set", "scheduling.fair=true"], "at most 1000"),
        (["--weight", "nan", "--set", "scheduling.fair=true"], "--weight"),
    ],
)
def test_a_weight_that_cannot_apply_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("{}\n")
    assert main(["submit", str(batch), *args]) == EXIT_USAGE
    assert says in capsys.readouterr().err
