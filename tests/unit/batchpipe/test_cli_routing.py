"""``--route`` on the command line: refusals happen before anything touches Kafka."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from batchpipe import Client
from batchpipe.cli import main
from tests.unit.batchpipe.test_cli_help import UNUSED_BOOTSTRAP
from worker.config import load_config
from worker.routing import UnroutedModelError

CHAT = "smollm2-135m-instruct"


def batch(tmp_path: Path, *models: str) -> Path:
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        }
        for i, model in enumerate(models, start=1)
    ]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def submit(*args: str) -> int:
    return main(["submit", *args, "--bootstrap", UNUSED_BOOTSTRAP])


def test_a_model_without_a_route_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = batch(tmp_path, "gpt-4o-mini", "gpt-4o-mini")
    assert submit(str(path), "--route", f"{CHAT}=chat", "--route", "echo=echo") == 2
    err = capsys.readouterr().err
    assert err.startswith("batchpipe: error 4002: model 'gpt-4o-mini' has no route")
    assert f"'{CHAT}'" in err and "'echo'" in err


def test_routes_from_the_configuration_file_refuse_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump({"kafka": {"routes": {CHAT: "chat"}}}))
    assert submit(str(batch(tmp_path, "echo")), "-c", str(config)) == 2
    assert "model 'echo' has no route" in capsys.readouterr().err


def test_a_mixed_file_is_refused_naming_its_lines_even_when_both_are_routed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = batch(tmp_path, CHAT, "echo", CHAT, "echo")
    assert submit(str(path), "--route", f"{CHAT}=chat", "--route", "echo=echo") == 2
    err = capsys.readouterr().err
    assert "nothing was published" in err
    assert "line 2: 4002 model 'echo' differs from" in err and "(line 1)" in err
    assert "line 4: 4002" in err and "line 3" not in err


def test_topic_and_routes_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = batch(tmp_path, CHAT)
    assert submit(str(path), "--topic", "t", "--route", f"{CHAT}=chat") == 2
    assert "--topic t: routes are set" in capsys.readouterr().err


def test_a_malformed_route_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "b", "--route", "no-equals-sign"])
    assert exc.value.code == 2
    assert "expected MODEL=TOPIC" in capsys.readouterr().err


def test_a_route_onto_the_results_topic_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert submit(str(batch(tmp_path, CHAT)), "--route", f"{CHAT}=batchpipe.results") == 2
    assert "is the kafka.results_topic" in capsys.readouterr().err


def test_a_worker_reading_another_topic_than_its_models_route_does_not_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {"requests_topic": "batchpipe.requests", "routes": {"echo": "echo"}},
                "engine": {"kind": "echo", "model": "echo"},
            }
        )
    )
    # refused before the model loads or Kafka is reached
    assert main(["worker", "-c", str(config), "--bootstrap", UNUSED_BOOTSTRAP]) == 2
    err = capsys.readouterr().err
    assert "kafka.requests_topic: 'batchpipe.requests'" in err and "'echo'" in err


def test_the_client_refuses_in_memory_requests_of_an_unrouted_model_before_kafka() -> None:
    client = Client(load_config(environ={}, routes=[(CHAT, "chat")]), bootstrap=UNUSED_BOOTSTRAP)
    assert client.routing.topic_for(CHAT) == "chat"
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
    }
    with pytest.raises(UnroutedModelError, match="model 'echo' has no route"):
        client.submit([line])
