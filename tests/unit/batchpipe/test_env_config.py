"""Configuration from the environment (worker/envconfig.py, through load_config)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.config import ConfigError, load_config


@pytest.mark.parametrize(
    "name",
    ["BATCHPIPE_REMOTE_API_KEY", "BATCHPIPE_CHAOS_REPORT", "BATCHPIPE_WEBHOOK_SECRET"],
)
def test_variables_that_are_not_settings_are_left_alone(name: str) -> None:
    assert load_config(environ={name: "x"}) == load_config(environ={})


def test_a_nested_setting_and_a_librdkafka_key() -> None:
    config = load_config(
        environ={
            "BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS": "kafka:9092",
            "BATCHPIPE_KAFKA__CLIENT__SECURITY_PROTOCOL": "SSL",
            "BATCHPIPE_ENGINE__REMOTE__MAX_RETRIES": "2",
            "BATCHPIPE_ENGINE__KIND": "openai",
            "BATCHPIPE_ENGINE__REMOTE__BASE_URL": "http://vllm:8000/v1",
        }
    )
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.kafka.client == {"security.protocol": "SSL"}
    assert config.engine.remote.max_retries == 2


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("BATCHPIPE_KAFKA_BOOTSTRAP_SERVERS", ["did you mean BATCHPIPE_KAFKA__BOOTSTRAP_SERVERS"]),
        ("BATCHPIPE_ENGINE_REMOTE_BASE_URL", ["BATCHPIPE_ENGINE__REMOTE__BASE_URL"]),
        ("BATCHPIPE_KAFKA__GROUPID", ["kafka has no setting 'groupid'", "group_id"]),
        ("BATCHPIPE_NOPE__X", ["no setting 'nope'"]),
    ],
)
def test_a_misspelt_setting_names_its_variable_and_the_spelling_meant(
    name: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(environ={name: "1"})
    assert name in str(exc.value)
    for word in words:
        assert word in str(exc.value)


def test_a_refused_value_names_its_variable_unless_set_overrode_it() -> None:
    with pytest.raises(ConfigError, match="from environment BATCHPIPE_BATCHING__TIMEOUT_MS"):
        load_config(environ={"BATCHPIPE_BATCHING__TIMEOUT_MS": "soon"})
    with pytest.raises(ConfigError) as exc:
        load_config(
            None, ["batching.timeout_ms=later"], environ={"BATCHPIPE_BATCHING__TIMEOUT_MS": "x"}
        )
    assert "environment" not in str(exc.value)


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("BATCHPIPE_METRICS__PORT", "9" * 5_000, ["cannot be read", "4300 digits"]),
        ("BATCHPIPE_METRICS__PORT", "[" * 100_000, ["cannot be read"]),
        ("BATCHPIPE_API__KEY_WEIGHTS", "{a: " * 3_000, ["cannot be read"]),
        ("BATCHPIPE_METRICS__PORT__X", "1", ["metrics.port is one value", "METRICS__PORT"]),
        ("BATCHPIPE_ÉTÉ__X", "1", ["no setting 'été'"]),
        ("BATCHPIPE_KAFKA__ÉTÉ", "ü" * 100_000, ["kafka has no setting 'été'"]),
    ],
)
def test_any_unicode_or_huge_value_is_a_config_error_naming_its_variable(
    name: str, value: str, words: list[str]
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(environ={name: value})
    message = str(refused.value)
    assert f"environment {name}" in message and len(message) < 2_000
    assert all(word in message for word in words), message


@settings(max_examples=300, deadline=None)
@given(
    path=st.sampled_from(
        ["METRICS__PORT", "SCHEDULING__WEIGHT", "API__KEY_WEIGHTS", "KAFKA__CLIENT__X", "X__Y"]
    ),
    value=st.one_of(
        st.text(max_size=300),
        st.text(alphabet="[{-:9.e ", max_size=3_000),
        st.integers(min_value=4_000, max_value=6_000).map(lambda n: "7" * n),
    ),
)
def test_any_value_loads_or_is_refused_naming_its_variable(path: str, value: str) -> None:
    name = f"BATCHPIPE_{path}"
    try:
        load_config(environ={name: value})
    except ConfigError as exc:
        assert name in str(exc) or path.lower().replace("__", ".") in str(exc)
