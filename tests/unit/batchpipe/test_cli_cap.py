"""``batchpipe run --max-tokens/--max-cost-usd``: read and bounded as serve's metadata,
refused by name before anything is published; ``submit`` refuses a cap it cannot enforce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchpipe.cli import EXIT_USAGE, main

PRICED = 'api.prices={"echo": {"prompt_per_1m": 1.5, "completion_per_1m": 6}}'


def _batch(path: Path, models: tuple[str, ...] = ("echo",)) -> Path:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        }
        for i, model in enumerate(models)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("flag", ["--max-tokens", "--max-cost-usd"])
def test_submit_refuses_a_cap_it_would_not_enforce(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    assert main(["submit", str(_batch(tmp_path / "b.jsonl")), flag, "100"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{flag}: submit does not follow the batch" in err
    assert "batchpipe run" in err and "nothing was published" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--max-tokens", "lots"], "--max-tokens: must be a whole number of tokens"),
        (["--max-tokens", "0"], "--max-tokens: must be a whole number"),
        (["--max-tokens", "-5"], "--max-tokens: must be a whole number"),
        (["--max-tokens", "1.5"], "--max-tokens: must be a whole number"),
        (["--max-tokens", "1000000000001"], "from 1 to 1000000000000"),
        (["--max-cost-usd", "0", "--set", PRICED], "--max-cost-usd: must be a number"),
        (["--max-cost-usd", "nan", "--set", PRICED], "--max-cost-usd: must be a number"),
        (["--max-cost-usd", "2000000", "--set", PRICED], "at most 1e+06"),
        (["--max-cost-usd", "2.5"], "--max-cost-usd: model 'echo' has no price in api.prices"),
    ],
)
def test_run_refuses_a_cap_out_of_bounds_by_name_before_the_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    # no broker listens on port 1: the refusal comes before it is asked
    batch = _batch(tmp_path / "b.jsonl")
    assert main(["run", str(batch), "--bootstrap", "127.0.0.1:1", *args]) == EXIT_USAGE
    assert says in capsys.readouterr().err


def test_a_cost_cap_of_a_file_of_several_models_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = _batch(tmp_path / "b.jsonl", ("echo", "other"))
    args = ["run", str(batch), "--mixed-models", "--max-cost-usd", "1", "--set", PRICED]
    assert main([*args, "--bootstrap", "127.0.0.1:1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--max-cost-usd: model '(several models)' has no price" in err
    assert "--max-tokens" in err  # what to cap it with instead


def test_run_help_explains_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-tokens N" in text and "4008 batch_cap_reached" in text and "exits 5" in text
    assert "api.prices" in text
