"""A ``--set`` value or a schema error never turns into a traceback or a 100 KB message."""

from __future__ import annotations

import pytest

from worker.config import ConfigError, load_config


def test_a_set_value_yaml_cannot_read_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(sets=[f"metrics.port={'9' * 5000}"], environ={})
    message = str(caught.value)
    assert "--set metrics.port" in message
    assert len(message) < 500


def test_a_set_value_nested_too_deep_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(sets=["batching.timeout_ms=" + "[" * 100_000], environ={})
    assert "--set batching.timeout_ms" in str(caught.value)


def test_a_huge_wrong_value_is_named_not_echoed_whole() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(sets=["batching.timeout_ms=" + "x" * 100_000], environ={})
    message = str(caught.value)
    assert "batching.timeout_ms" in message
    assert len(message) < 2_000
