"""The routing table (model → requests topic): parsing, validation, lookups, the config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from worker.config import Config, ConfigError, EngineConfig, KafkaConfig, load_config
from worker.errors import ErrorCode
from worker.routing import (
    RoutesError,
    RoutingTable,
    UnroutedModelError,
    parse_route,
    served_route_problem,
)

CHAT, EMBED = "smollm2-135m-instruct", "org/all-MiniLM-L6-v2.q8"


@pytest.mark.parametrize(
    ("text", "route"),
    [
        (f"{CHAT}=chat.requests", (CHAT, "chat.requests")),
        (f"{EMBED}=embed-requests_1", (EMBED, "embed-requests_1")),  # dots and slash kept
        ("a=b=t", ("a=b", "t")),  # a topic has no "=": the last one splits
    ],
)
def test_a_route_is_model_equals_topic(text: str, route: tuple[str, str]) -> None:
    assert parse_route(text) == route


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("chat.requests", "expected MODEL=TOPIC"),
        ("=chat.requests", "expected MODEL=TOPIC"),
        (f"{CHAT}=", "expected MODEL=TOPIC"),
        (f"{CHAT}=chat requests", "not a Kafka topic name"),
        (f"{CHAT}={'t' * 250}", "not a Kafka topic name"),
        ("  =chat", "needs a model name"),
    ],
)
def test_a_bad_route_is_refused_naming_it(text: str, why: str) -> None:
    with pytest.raises(RoutesError, match=why) as caught:
        parse_route(text)
    assert repr(text) in str(caught.value)


def test_without_routes_every_model_goes_to_the_default_topic() -> None:
    table = RoutingTable("batchpipe.requests")
    assert {table.topic_for(m) for m in (CHAT, EMBED, "")} == {"batchpipe.requests"}
    assert table.topics == ("batchpipe.requests",)


def test_with_routes_each_model_goes_to_its_own_topic() -> None:
    table = RoutingTable("batchpipe.requests", {CHAT: "chat", EMBED: "embed"})
    assert (table.topic_for(CHAT), table.topic_for(EMBED)) == ("chat", "embed")
    # the default topic is no fallback once routes exist, and so is not read for requests
    assert table.topics == ("chat", "embed")


@pytest.mark.parametrize("model", ["gpt-4o-mini", ""])
def test_a_model_without_a_route_is_refused_never_sent_to_the_default(model: str) -> None:
    table = RoutingTable("batchpipe.requests", {CHAT: "chat", EMBED: "embed"})
    with pytest.raises(UnroutedModelError) as caught:
        table.topic_for(model)
    error = caught.value
    assert (error.code, error.model) == (ErrorCode.INVALID_PARAMETER, model)
    message = str(error)
    assert (f"model {model!r} has no route" if model else "a request without a model") in message
    assert repr(CHAT) in message and repr(EMBED) in message  # what would have been accepted
    assert "--route" in message


def test_the_table_is_immutable_and_independent_of_its_source() -> None:
    source = {CHAT: "chat"}
    table = RoutingTable("default", source)
    source[EMBED] = "embed"
    with pytest.raises(UnroutedModelError):
        table.topic_for(EMBED)
    with pytest.raises(TypeError):
        table.routes[EMBED] = "embed"  # type: ignore[index]


def test_two_models_on_one_topic_are_refused() -> None:
    with pytest.raises(RoutesError, match="already the topic of model") as caught:
        RoutingTable("default", {CHAT: "shared", EMBED: "shared"})
    assert repr(EMBED) in str(caught.value)


@pytest.mark.parametrize(
    "setting", ["results_topic", "dead_letter_topic", "control_topic", "state_topic"]
)
def test_a_route_to_a_topic_that_carries_something_else_is_refused(setting: str) -> None:
    kafka = KafkaConfig(routes={CHAT: getattr(KafkaConfig(), setting)})
    with pytest.raises(RoutesError, match=f"is the kafka.{setting}"):
        RoutingTable.from_kafka(kafka)
    with pytest.raises(ConfigError, match=f"is the kafka.{setting}"):
        load_config(sets=[f"kafka.routes.{CHAT}={getattr(kafka, setting)}"], environ={})


def test_routes_come_from_the_file_then_set_then_route_flags(tmp_path: Path) -> None:
    file = tmp_path / "fleet.yaml"
    file.write_text(yaml.safe_dump({"kafka": {"routes": {CHAT: "chat", "old": "old-topic"}}}))
    config = load_config(
        file,
        sets=[f"kafka.routes.{EMBED}=embed"],  # everything after kafka.routes. is the model
        environ={},
        routes=[("old", "new-topic")],
    )
    assert dict(config.kafka.routes) == {CHAT: "chat", EMBED: "embed", "old": "new-topic"}
    assert RoutingTable.from_kafka(config.kafka).topic_for("old") == "new-topic"
    assert load_config(environ={}).kafka.routes == {}  # the default: no routing


def test_the_schema_refuses_a_bad_topic_or_an_empty_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.routes"):
        load_config(routes=[(CHAT, "bad topic")], environ={})
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump({"kafka": {"routes": {"": "chat"}}}))
    with pytest.raises(ConfigError, match=r"kafka\.routes"):
        load_config(file, environ={})


def _worker(requests_topic: str, routes: dict[str, str], model: str = CHAT) -> Config:
    return Config(
        kafka=KafkaConfig(requests_topic=requests_topic, routes=routes),
        engine=EngineConfig(model=model),
    )


def test_a_worker_must_read_the_topic_its_model_is_routed_to() -> None:
    assert served_route_problem(_worker("chat", {})) is None
    assert served_route_problem(_worker("chat", {CHAT: "chat", EMBED: "embed"})) is None
    problem = served_route_problem(_worker("batchpipe.requests", {CHAT: "chat"}))
    assert problem is not None
    assert "'batchpipe.requests'" in problem and "'chat'" in problem and repr(CHAT) in problem
    # a worker of a model the table does not name: publishers refuse all its requests
    unrouted = served_route_problem(_worker("other", {EMBED: "embed"}))
    assert unrouted is not None
    assert f"engine.model: {CHAT!r} has no route" in unrouted and f"{CHAT}: other" in unrouted
