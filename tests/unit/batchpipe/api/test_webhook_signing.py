"""Events and their signatures, judged by the official SDK's ``client.webhooks.unwrap``;
the endpoints' secrets read from the environment or a file, never shown."""

from __future__ import annotations

import base64
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from openai import InvalidWebhookSignatureError, OpenAI
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from batchpipe.api.records import BatchRecord
from batchpipe.api.webhooks.endpoints import EVENTS, load_endpoints
from batchpipe.api.webhooks.signing import event_of, secret_key, signed_headers
from worker.config import ApiConfig, ConfigError, load_config

SECRET = "whsec_" + base64.b64encode(b"a secret of thirty-two bytes....").decode()
BATCH = BatchRecord("batch_1", "alice", "file-1", "/v1/chat/completions", "24h", 100, 86500)


BatchEnd = (
    BatchCompletedWebhookEvent
    | BatchFailedWebhookEvent
    | BatchExpiredWebhookEvent
    | BatchCancelledWebhookEvent
)


def ended(status: str) -> BatchRecord:
    return replace(BATCH, status=status, **{f"{status}_at": 200})  # type: ignore[arg-type]


def delivery(batch: BatchRecord, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    event = event_of(batch)
    body = event.body()
    return body, dict(signed_headers(secret_key(secret), event.webhook_id, int(time.time()), body))


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("completed", BatchCompletedWebhookEvent),
        ("failed", BatchFailedWebhookEvent),
        ("expired", BatchExpiredWebhookEvent),
        ("cancelled", BatchCancelledWebhookEvent),
    ],
)
def test_the_sdk_unwraps_each_end_into_its_type(status: str, kind: type) -> None:
    body, headers = delivery(ended(status))
    event = OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(event, kind)
    assert isinstance(event, BatchEnd)
    assert (event.type, event.data.id, event.created_at) == (f"batch.{status}", "batch_1", 200)
    assert headers["webhook-id"] == "wh_" + event.id.removeprefix("evt_")


def test_a_wrong_secret_or_a_changed_body_is_refused() -> None:
    body, headers = delivery(ended("completed"))
    sdk = OpenAI(api_key="unused").webhooks
    other = "whsec_" + base64.b64encode(b"another secret").decode()
    with pytest.raises(InvalidWebhookSignatureError):
        sdk.unwrap(body, headers, secret=other)
    with pytest.raises(InvalidWebhookSignatureError):
        sdk.unwrap(body.replace(b"batch_1", b"batch_2"), headers, secret=SECRET)


@pytest.mark.parametrize("secret", ["whsec_ab-cd_efgh", "whsec_" + "YWJj" * 8 + "\n"])
def test_a_secret_the_sdk_decodes_loosely_signs_as_the_sdk_reads_it(secret: str) -> None:
    """The SDK skips characters outside base64's alphabet (here - and _ of the URL-safe
    alphabet, a newline): the key must be the one it derives."""
    body, headers = delivery(ended("completed"), secret=secret)
    event = OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret=secret)
    assert isinstance(event, BatchCompletedWebhookEvent) and event.data.id == "batch_1"


def test_a_plain_text_secret_signs_as_the_sdk_reads_it() -> None:
    body, headers = delivery(ended("failed"), secret="plain-text-secret")
    event = OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret="plain-text-secret")
    assert event.type == "batch.failed"


def test_one_change_is_one_event_id_whoever_builds_it() -> None:
    assert event_of(ended("completed")) == event_of(replace(ended("completed"), version=7))
    assert event_of(ended("completed")).id != event_of(ended("failed")).id
    assert event_of(BATCH).type == "batch.validating" and event_of(BATCH).created_at == 100


def test_secrets_come_from_the_environment_or_a_file_and_are_never_shown(tmp_path: Path) -> None:
    secret_file = tmp_path / "bob.secret"
    secret_file.write_text("bob-secret\n")
    api = ApiConfig(
        webhooks={
            "alice": {"url": "https://a.example/h", "secret_env": "ALICE_HOOK"},
            "bob": {
                "url": "https://b.example/h",
                "events": ["batch.failed"],
                "secret_file": str(secret_file),
            },
        }
    )
    found = load_endpoints(api, {"alice", "bob"}, {"ALICE_HOOK": SECRET})
    assert found["alice"].key == b"a secret of thirty-two bytes...."
    assert found["alice"].events == frozenset(EVENTS)
    assert (found["bob"].key, found["bob"].events) == (b"bob-secret", frozenset({"batch.failed"}))
    assert "secret" not in repr(found["alice"]) and "thirty" not in repr(found)


def test_an_endpoint_for_an_owner_without_a_key_stops_the_start() -> None:
    api = ApiConfig(webhooks={"carol": {"url": "https://c.example/h", "secret_env": "C"}})
    with pytest.raises(ConfigError, match=r"api\.webhooks\.carol: no API key has owner 'carol'"):
        load_endpoints(api, {"alice", "bob"}, {"C": "secret"})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"url": "https://a.example/h"}, "exactly one of secret_env and secret_file"),
        ({"url": "https://a.example/h", "secret_env": "NOT_SET"}, "environment variable NOT_SET"),
        ({"url": "https://a.example/h", "secret_file": "/nonexistent"}, "cannot read"),
        ({"url": "https://a.example/h", "secret_env": "BAD"}, "not usable"),
    ],
)
def test_an_unusable_secret_stops_the_start_naming_the_entry(
    spec: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        load_endpoints(ApiConfig(webhooks={"alice": spec}), {"alice"}, {"BAD": "whsec_not base64!"})
    assert "api.webhooks.alice" in str(raised.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://user:hunter2@a.example/h", "no user or password"),
        ("https:///h", "with a host"),
        ("http://", "with a host"),
        ("https://a.example:99999/h", "Port out of range"),
        ("https://a.example/a b", "spaces or control characters"),
        ("https://a.example/h\r\nX-Injected: 1", "spaces or control characters"),
        ("https://a.example/h#part", "fragment"),
        ("https://bücher.example/h", "punycode"),
        ("https://a.example/café", "percent-encode"),
        ("http://10.0.0.7/h", "10.0.0.7 is a private address"),
        ("http://169.254.169.254/latest", "link-local"),
        ("http://[::1]:8080/h", "loopback"),
    ],
)
def test_a_url_that_can_never_be_sent_to_stops_the_start_naming_the_field(
    url: str, message: str
) -> None:
    api = ApiConfig(webhooks={"alice": {"url": url, "secret_env": "S"}})
    with pytest.raises(ConfigError, match=message) as raised:
        load_endpoints(api, {"alice"}, {"S": SECRET})
    assert str(raised.value).startswith("api.webhooks.alice.url: ")
    assert "hunter2" not in str(raised.value)


def test_an_address_in_an_allowed_network_is_accepted_at_the_start() -> None:
    api = ApiConfig(
        webhooks={"alice": {"url": "http://10.0.0.7:9000/h", "secret_env": "S"}},
        webhook_allow_networks=("10.0.0.0/24",),
    )
    assert load_endpoints(api, {"alice"}, {"S": SECRET})["alice"].url == "http://10.0.0.7:9000/h"


def test_a_delivery_signed_long_after_its_event_is_accepted_and_an_old_one_is_not() -> None:
    """The signature's timestamp is the attempt's, not the event's: a retry hours later
    passes the SDK's 5-minute window, while the same headers replayed later do not."""
    event = event_of(ended("completed"))  # created_at 200: long ago
    body, sdk = event.body(), OpenAI(api_key="unused").webhooks
    now = int(time.time())
    fresh = dict(signed_headers(secret_key(SECRET), event.webhook_id, now, body))
    assert sdk.unwrap(body, fresh, secret=SECRET).created_at == 200
    stale = dict(signed_headers(secret_key(SECRET), event.webhook_id, now - 600, body))
    with pytest.raises(InvalidWebhookSignatureError, match="too old"):
        sdk.unwrap(body, stale, secret=SECRET)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("api.webhook_timeout_s=86400", "api.webhook_timeout_s: 86400 is greater than"),
        ("api.webhook_timeout_s=0", "api.webhook_timeout_s: 0 is less than or equal"),
        ("api.webhook_backoff_s=-1", "api.webhook_backoff_s: -1 is less than or equal"),
        (
            "api.webhook_backoff_s=7200",
            "api.webhook_backoff_s: 7200 exceeds api.webhook_backoff_max_s",
        ),
        ("api.webhook_backoff_max_s=1.0e+300", "api.webhook_backoff_max_s: 1e+300 is greater than"),
        (
            "api.webhook_allow_networks=10.0.0.0/8",
            "api.webhook_allow_networks: '10.0.0.0/8' is not",
        ),
    ],
)
def test_webhook_settings_out_of_range_stop_the_load_naming_them(
    setting: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(sets=[setting], environ={})
