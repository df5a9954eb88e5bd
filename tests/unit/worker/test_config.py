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


def refused(*sets: str, environ: dict[str, str] | None = None) -> str:
    """The ConfigError message for ``sets``, which must be refused."""
    with pytest.raises(ConfigError) as caught:
        load_config(sets=sets, environ=environ or {})
    return str(caught.value)


def test_commit_interval_must_fit_twice_in_the_transaction_timeout() -> None:
    # librdkafka's transaction.timeout.ms defaults to 60 s
    assert load_config(sets=["kafka.commit_interval_ms=30000"], environ={})
    message = refused("kafka.commit_interval_ms=60000")
    assert "kafka.commit_interval_ms" in message and "transaction.timeout.ms" in message
    assert "60000" in message
    refused("kafka.commit_interval_ms=30001")
    # a longer transaction timeout, from a file, the environment or --set (text or number)
    longer = {"BATCHPIPE_KAFKA__CLIENT__TRANSACTION_TIMEOUT_MS": "120000"}
    assert load_config(sets=["kafka.commit_interval_ms=60000"], environ=longer)
    refused("kafka.commit_interval_ms=60001", environ=longer)
    # no transactions, no transaction timeout
    assert load_config(
        sets=["kafka.delivery=at_least_once", "kafka.commit_interval_ms=60000"], environ={}
    )


def test_a_transaction_timeout_that_is_not_a_number_of_milliseconds_is_refused() -> None:
    for value in ("soon", "1.5", "0"):
        message = refused(f"kafka.client.transaction.timeout.ms={value}")
        assert "kafka.client.transaction.timeout.ms" in message


def test_only_eager_assignors_are_accepted() -> None:
    for eager in ("roundrobin", "range", "range,roundrobin"):
        sets = [f"kafka.client.partition.assignment.strategy={eager}"]
        assert load_config(sets=sets, environ={})
    for other in ("cooperative-sticky", "roundrobin,cooperative-sticky"):
        message = refused(f"kafka.client.partition.assignment.strategy={other}")
        assert "kafka.client.partition.assignment.strategy" in message
        assert "cooperative-sticky" in message
    message = refused("kafka.client.group.protocol=consumer")
    assert "kafka.client.group.protocol" in message
    assert load_config(sets=["kafka.client.group.protocol=classic"], environ={})


def test_answer_buffer_bounds_are_settings() -> None:
    config = load_config(environ={})
    assert (config.kafka.max_buffered_answers, config.kafka.max_buffered_bytes) == (
        4096,
        64 * 1024 * 1024,
    )
    assert load_config(sets=["kafka.max_buffered_answers=10"], environ={})
    assert "kafka.max_buffered_answers" in refused("kafka.max_buffered_answers=0")
    assert "kafka.max_buffered_bytes" in refused("kafka.max_buffered_bytes=10")


def test_default_max_tokens_must_leave_room_for_a_prompt_in_a_batch() -> None:
    assert load_config(sets=["generation.max_tokens=8191"], environ={})
    message = refused("generation.max_tokens=8192")
    assert "generation.max_tokens" in message and "batching.max_batch_tokens" in message
    assert "4003" in message
    refused("batching.max_batch_tokens=100")  # below the default max_tokens, 256


@pytest.mark.parametrize("name", ["max_message_bytes", "max_decompressed_bytes"])
def test_record_size_limits_have_an_upper_bound(name: str) -> None:
    assert load_config(sets=[f"limits.{name}={256 * 1024 * 1024}"], environ={})
    assert f"limits.{name}" in refused(f"limits.{name}={256 * 1024 * 1024 + 1}")


def test_a_batch_may_not_be_larger_than_the_requests_in_flight() -> None:
    assert load_config(sets=["batching.max_batch_size=64"], environ={})  # prefetch_count 64
    message = refused("batching.max_batch_size=65")
    assert "batching.max_batch_size" in message and "batching.prefetch_count" in message


@pytest.mark.parametrize(
    "item",
    [
        "engine.echo_mode=in_flight",
        "engine.simulated_token_s=0.01",
        "engine.simulated_token_per_seq_s=0.001",
    ],
)
def test_echo_settings_are_refused_for_other_engines(item: str) -> None:
    assert load_config(sets=["engine.kind=echo", item], environ={})
    message = refused(item)  # the default kind, auto
    assert f"engine.{item.split('.')[1].split('=')[0]}" in message and "not auto" in message


@pytest.mark.parametrize(
    "item",
    [
        "kafka.client.transactional.id=mine",
        "kafka.client.enable.auto.commit=true",
        "kafka.client.isolation.level=read_uncommitted",
    ],
)
def test_client_settings_the_worker_owns_are_refused(item: str) -> None:
    key = item.split("=")[0]
    assert key in refused(item)


def test_metrics_listen_on_the_loopback_interface_by_default() -> None:
    assert load_config(environ={}).metrics.host == "127.0.0.1"


def test_dummy_weights_are_for_the_trtllm_engine_only() -> None:
    config = load_config(sets=["engine.kind=trtllm", "engine.load_format=dummy"], environ={})
    assert config.engine.load_format == "dummy"
    assert load_config(environ={}).engine.load_format == "auto"
    assert "engine.load_format: 'dummy' is supported by the trtllm" in refused(
        "engine.load_format=dummy"
    )
    assert "load_format" in refused("engine.kind=trtllm", "engine.load_format=random")


def test_the_embed_task_needs_an_embedding_engine_and_model() -> None:
    embed = ["engine.task=embed", "engine.model=all-minilm-l6-v2"]
    assert load_config(sets=[*embed, "engine.kind=vllm"], environ={}).engine.task == "embed"
    assert load_config(environ={}).engine.task == "generate"
    assert load_config(sets=embed, environ={}).engine.kind == "auto"  # vllm or hf at start
    assert "engine.task: embed is served by engine.kind hf, vllm or openai" in refused(
        *embed, "engine.kind=trtllm"
    )
    assert "is a model for task generate" in refused("engine.task=embed")  # smollm2
    assert "is a model for task embed" in refused("engine.model=all-minilm-l6-v2")
    assert "task" in refused("engine.task=rerank")


def test_the_producer_takes_every_record_the_worker_accepts_with_headroom() -> None:
    from worker.config import RECORD_HEADROOM_BYTES, producer_max_bytes

    # the default: the largest accepted value plus headroom for key, headers and framing
    config = load_config(environ={})
    assert (
        producer_max_bytes(config.kafka, config.limits) == 6 * 1024 * 1024 + RECORD_HEADROOM_BYTES
    )
    # never below librdkafka's own default
    small = load_config(sets=["limits.max_message_bytes=10"], environ={})
    assert producer_max_bytes(small.kafka, small.limits) == 1_000_000
    # a raw setting passes through (text from the environment, or a number) when it is enough
    raised = {"BATCHPIPE_KAFKA__CLIENT__MESSAGE_MAX_BYTES": "20000000"}
    config = load_config(environ=raised)
    assert producer_max_bytes(config.kafka, config.limits) == 20_000_000


def test_a_producer_limit_below_the_accepted_record_size_is_refused() -> None:
    message = refused("kafka.client.message.max.bytes=1000000")
    assert "kafka.client.message.max.bytes" in message and "limits.max_message_bytes" in message
    # lowering the accepted size makes it consistent
    assert load_config(
        sets=["kafka.client.message.max.bytes=1000000", "limits.max_message_bytes=900000"],
        environ={},
    )
    assert "kafka.client.message.max.bytes" in refused("kafka.client.message.max.bytes=big")


def test_the_openai_kind_needs_its_server_and_its_settings_need_that_kind() -> None:
    remote = ["engine.kind=openai", "engine.model=served-name"]
    ok = load_config(sets=[*remote, "engine.remote.base_url=https://llm.example/v1"], environ={})
    assert ok.engine.remote.base_url == "https://llm.example/v1"
    assert "engine.remote.base_url: an http:// or https:// URL with a host" in refused(*remote)
    for bad in ("ftp://x/v1", "http:///v1", "http://x:port/v1"):
        assert "engine.remote.base_url: " in refused(*remote, f"engine.remote.base_url={bad}")
    leaked = refused(*remote, "engine.remote.base_url=https://me:sk-live@llm.example/v1")
    assert "engine.remote.base_url: holds credentials" in leaked and "sk-live" not in leaked
    assert "a query or fragment" in refused(*remote, "engine.remote.base_url=http://x/v1?k=1")
    assert "engine.remote.metrics_url: " in refused(
        *remote, "engine.remote.base_url=http://x/v1", "engine.remote.metrics_url=file:///etc/x"
    )
    assert "engine.remote.timeout_s: 600 must be below engine.engine_timeout_s" in refused(
        *remote, "engine.remote.base_url=http://x/v1", "engine.remote.timeout_s=600"
    )
    for key, value in (("timeout_s", "100000"), ("backoff_max_s", "86400"), ("timeout_s", "0")):
        assert f"engine.remote.{key}: " in refused(
            *remote, "engine.remote.base_url=http://x/v1", f"engine.remote.{key}={value}"
        )
    assert "engine.remote.max_retries: applies to engine.kind openai only, not echo" in refused(
        "engine.kind=echo", "engine.remote.max_retries=2"
    )
    url = "engine.remote.base_url=http://x/v1"
    assert "engine.remote.max_concurrency: 64 exceeds batching.max_batch_size (32)" in refused(
        *remote, url, "engine.remote.max_concurrency=64"
    )
    assert "engine.remote.initial_concurrency: 9 must lie between" in refused(
        *remote, url, "engine.remote.initial_concurrency=9", "engine.remote.max_concurrency=8"
    )
    assert "api_key_env" in refused(*remote, url, "engine.remote.api_key_env=sk-live key")
