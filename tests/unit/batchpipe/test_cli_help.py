"""The command line explains itself, and fails cleanly before touching Kafka."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchpipe import BatchNotFoundError, BatchpipeError, CollectTimeoutError
from batchpipe.cli import config, duration, format_status, main
from batchpipe.collect import BatchStatus
from tests import ROOT
from worker.config import Config, ConfigError
from worker.errors import ErrorCode, ModelLoadError, RequestError

UNUSED_BOOTSTRAP = "127.0.0.1:1"  # nothing listens there: a command that connects would hang

COMMON = ["--config", "--set", "--bootstrap"]
HELP = {
    None: ["broker", "worker", "submit", "collect", "status", "demo", "Exit codes"],
    "broker": ["--port", "default: 0"],
    "worker": [*COMMON, "engine.kind openai", "engine.remote.base_url", "api_key_env"],
    "submit": [
        *COMMON,
        "--batch-id",
        "--topic",
        "--max-lines",
        "default: 50000",
        "--max-file-bytes",
        "--max-line-bytes",
        "--mixed-models",
        "4003",
        "--route",
        "MODEL=TOPIC",
        "one requests topic per model",
    ],
    "collect": [
        *COMMON,
        "--batch-id",
        "--output",
        "--errors",
        "--timeout",
        "--quiet",
        "--since",
        "--topic",
        "beginning",
    ],
    "status": [
        *COMMON,
        "--json",
        "--price-per-1k",
        "--completion-window",
        "default: 24h",
        "--since",
        "--route",
    ],
    "retry": [*COMMON, "--url", "--api-key", "OPENAI_API_KEY", "5xxx", "batchpipe_retry_of"],
    "demo": [*COMMON, "--requests", "--out-dir", "examples/requests.jsonl"],
}


@pytest.mark.parametrize("command", list(HELP), ids=lambda c: c or "top")
def test_help_runs_and_names_every_option(command: str | None) -> None:
    args = [sys.executable, "-m", "batchpipe.cli", *([command] if command else []), "--help"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    for word in HELP[command]:
        assert word in text, f"{word!r} missing from `batchpipe {command or ''} --help`"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("24h", 86400), ("1.5d", 129600)]
)
def test_duration(text: str, seconds: float) -> None:
    assert duration(text) == seconds


def test_config_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "b", "--bootstrap", UNUSED_BOOTSTRAP, "--set", "kafka.partitions=x"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("batchpipe: invalid configuration")
    assert "kafka.partitions" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("error", "exit_code", "line"),
    [
        (RequestError(ErrorCode.OVER_LIMIT, "too long"), 1, "batchpipe: error 4003: too long"),
        (ModelLoadError("no such model"), 1, "batchpipe: error 5003: no such model"),
        (BatchNotFoundError("no batch b"), 1, "batchpipe: no batch b"),
        (ConfigError("bad key"), 2, "batchpipe: bad key"),
        (
            CollectTimeoutError(BatchStatus("b", 3, 1, 0, "in_progress", 0, 0, 0, None), 5),
            124,
            "batchpipe: batch b: 1 of 3 requests answered after 5s",
        ),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BatchpipeError) else None,
)
def test_a_batchpipe_error_is_one_line_with_its_code_and_exit_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BatchpipeError,
    exit_code: int,
    line: str,
) -> None:
    def fail(args: object) -> Config:
        raise error

    monkeypatch.setattr(config, "load", fail)  # where status reads it
    assert main(["status", "b", "--bootstrap", UNUSED_BOOTSTRAP]) == exit_code
    assert capsys.readouterr().err == line + "\n"


def test_invalid_batch_file_exits_2_naming_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"custom_id": "a"}\nnot json\n')
    assert main(["submit", str(path), "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    err = capsys.readouterr().err
    assert "nothing was published" in err
    assert "line 1: 4001" in err and "line 2: 4001" in err


def test_missing_batch_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", str(tmp_path / "absent.jsonl"), "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    assert "absent.jsonl" in capsys.readouterr().err


def test_bad_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "b", "--completion-window", "soon"])
    assert exc.value.code == 2
    assert "not a duration" in capsys.readouterr().err


def test_status_text_and_json_forms() -> None:
    status = BatchStatus("b1", 10, 7, 1, "in_progress", 100, 50, 5, 0.3)
    text = format_status(status, 2.0)
    assert "b1  in_progress" in text
    assert "total 10  completed 7  failed 1" in text
    assert "prompt 100  completion 50  reasoning 5" in text
    assert "cost      0.3000 (at 2 per 1k tokens)" in text
    assert "cost" not in format_status(BatchStatus("b", 1, 0, 0, "expired", 0, 0, 0, None), None)
    assert json.loads(json.dumps(status.to_dict()))["status"] == "in_progress"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["list", "--limit", "-1"], "'-1': at least 1"),
        (["list", "--limit", "0"], "'0': at least 1"),
        (["list", "--limit", "ten"], "not a whole number"),
        (["list", "--last", "0"], "more than 0"),
        (["list", "--last", "99999999999999999999d"], "at most 3650d"),
        (["collect", "b", "--timeout", "9" * 400], "at most 3650d"),
        (["status", "b", "--completion-window", "0s"], "more than 0"),
    ],
)
def test_a_flag_out_of_bounds_is_exit_2_naming_it(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*args, "--bootstrap", UNUSED_BOOTSTRAP])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err and args[1] in err and "Traceback" not in err


def test_the_weight_help_states_the_bound_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "[0.001, 1000]" in text and "(0, 1000]" not in text


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("BATCHPIPE_KAFKA__CLIENT__NOT_A_KEY", "1", "kafka.client.not.a.key"),
        ("BATCHPIPE_KAFKA__CLIENT__SOCKET_TIMEOUT_MS", "äbc", "kafka.client.socket.timeout.ms"),
    ],
)
def test_a_client_setting_librdkafka_refuses_is_exit_2_naming_its_variable(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["list", "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    err = capsys.readouterr().err
    assert says in err and f"from environment {variable}" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["worker"], ["serve", "--port", "0"]])
def test_worker_and_serve_refuse_a_client_setting_before_loading_anything(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """They met it only once their clients were built (a worker after loading its model),
    as a raw KafkaError with exit 1."""
    monkeypatch.setenv("BATCHPIPE_KAFKA__CLIENT__NOT_A_KEY", "1")
    assert main([*command, "--set", "engine.kind=echo"]) == 2
    err = capsys.readouterr().err
    assert "kafka.client.not.a.key" in err and "BATCHPIPE_KAFKA__CLIENT__NOT_A_KEY" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--batch-id", "b" * 257], "--batch-id: at most 256 characters, got 257"),
        (["--batch-id", "evil\x1b[2J"], "--batch-id: 'evil\\x1b[2J' holds a character"),
        (["--key", "k" * 100_000, "--set", "scheduling.fair=true"], "--key: at most 256"),
        (["--key", "a\nb", "--set", "scheduling.fair=true"], "--key: 'a\\nb' holds"),
    ],
)
def test_a_batch_id_or_key_the_feeder_would_drop_is_refused_before_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text("{}\n")
    assert main(["submit", str(batch), *args, "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    assert says in capsys.readouterr().err


def test_the_client_refuses_them_too_and_list_shows_a_hostile_id_escaped() -> None:
    from batchpipe import Client
    from batchpipe.listing import format_listing
    from tests.unit.batchpipe.api.fakes import LINE

    with pytest.raises(ValueError, match="batch_id: at most 256"):
        Client(Config()).submit([json.loads(LINE)], batch_id="b" * 300)
    hostile = BatchStatus("batch_1\x1b]0;pwned\x07", 1, 1, 0, "completed", 0, 0, 0, None)
    shown = format_listing([hostile])
    assert "\x1b" not in shown and "\\x1b" in shown
