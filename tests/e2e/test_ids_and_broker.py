"""Items 4, 6 and 7 of issue 41: a missing broker, a mistyped batch id, and the batch id
passed alike to every command, each as a user types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import clean_env, echo_examples, run, worker, write_config
from tests.integration.fleet import free_port

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("command", "source"),
    [
        (["submit", "{file}"], "from environment BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS"),
        (["status", "batch_1_abc"], "from environment BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS"),
        (["collect", "batch_1_abc", "--set", "kafka.bootstrap_servers={addr}"], "--set"),
    ],
)
def test_a_missing_broker_is_one_line_naming_the_address_and_what_to_do(
    tmp_path: Path, command: list[str], source: str
) -> None:
    address = f"127.0.0.1:{free_port()}"
    file = echo_examples(tmp_path)
    args = [a.format(file=file, addr=address) for a in command]
    env = clean_env(BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS=address)
    done = run(*args, env=env, timeout=60, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no librdkafka log, no traceback
    assert address in lines[0] and source in lines[0]
    assert "batchpipe broker" in lines[0] and "--set kafka.bootstrap_servers=" in lines[0]
    assert list(tmp_path.glob("*.jsonl")) == [file]  # collect wrote nothing


def test_collect_of_a_mistyped_batch_id_fails_at_once_and_writes_nothing(
    tmp_path: Path, broker: str
) -> None:
    config = write_config(tmp_path, broker, {"kind": "echo"})
    submitted = run("submit", str(echo_examples(tmp_path)), "-c", str(config))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    typo = batch_id[:-1] + ("1" if batch_id.endswith("0") else "0")  # one character off
    done = run("collect", typo, "-c", str(config), timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # as status answers, not 124 after a wait
    assert typo in done.stderr
    assert not list(tmp_path.glob(f"{typo}*"))  # no empty output or error file left behind
    assert run("status", typo, "-c", str(config), timeout=120).returncode == 1


def test_every_command_takes_the_batch_id_as_its_argument(tmp_path: Path, broker: str) -> None:
    config = write_config(tmp_path, broker, {"kind": "echo"})
    with worker(config):
        submitted = run("submit", str(echo_examples(tmp_path)), "-c", str(config))
        assert submitted.returncode == 0, submitted.stderr
        batch_id = submitted.stdout.strip()
        out = tmp_path / "out.jsonl"
        done = run(
            "collect", batch_id, "-o", str(out), "--timeout", "240", "-c", str(config),
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        again = tmp_path / "again.jsonl"
        old = run(
            "collect", "--batch-id", batch_id, "-o", str(again), "-c", str(config),
            cwd=tmp_path,
        )  # fmt: skip
        assert old.returncode == 0, old.stderr  # the older spelling still works
        status = run("status", batch_id, "-c", str(config))
        assert status.returncode == 0 and "completed" in status.stdout
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert len(set(ids)) == 8
    assert sorted(ids) == sorted(json.loads(x)["custom_id"] for x in again.read_text().splitlines())


def test_collect_without_a_batch_id_says_how_to_give_it() -> None:
    done = run("collect", timeout=60)
    assert done.returncode == 2
    assert "batchpipe collect ID" in done.stderr


def test_librdkafka_s_log_is_shown_when_asked_for(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    done = run("status", "batch_1_abc", "--bootstrap", address, "-v", timeout=60)
    assert done.returncode == 1
    assert "rdkafka" in done.stderr and address in done.stderr.splitlines()[-1]
    assert len(done.stderr.splitlines()) > 1
