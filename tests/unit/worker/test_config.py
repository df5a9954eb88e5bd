"""Settings the schema cannot judge alone: cross-field rules and what the worker derives."""

from __future__ import annotations

import pytest

from worker.config import BatchingConfig, ConfigError, load_config


def test_priority_aging_is_a_positive_number_of_milliseconds() -> None:
    assert load_config(environ={}).batching.priority_aging_ms == 10_000
    config = load_config(sets=["batching.priority_aging_ms=250"], environ={})
    assert config.batching == BatchingConfig(priority_aging_ms=250)
    with pytest.raises(ConfigError, match="priority_aging_ms"):
        load_config(sets=["batching.priority_aging_ms=0"], environ={})
