"""docker-compose.yml and the files it mounts, checked for structure and consistency.

No Docker engine runs here, so the stack is not started: these tests hold the compose
file to deploy/worker.yaml as the worker's own loader reads it (topics, partitions,
bootstrap listener, metrics port) and to the Prometheus and Grafana files it mounts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from tests import ROOT
from worker.config import Config, load_config, producer_max_bytes
from worker.kafka.produce import BATCH_FRAMING_BYTES
from worker.routing import RoutingTable, served_route_problem

WORKER_CONFIG = ROOT / "deploy" / "worker.yaml"
CONFIG_TARGET = "/etc/batchpipe/worker.yaml"
WORKERS = ("worker", "worker-embed", "worker-gpu")
# ${VAR:-default} / ${VAR-default} / ${VAR}: compose's interpolation, resolved to defaults
_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}")


def _defaults(value: Any) -> Any:
    """The compose file as `docker compose config` shows it with no variables set."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group("default") or "", value)
    if isinstance(value, list):
        return [_defaults(v) for v in value]
    if isinstance(value, dict):
        return {k: _defaults(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = _defaults(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


@pytest.fixture(scope="module")
def config() -> Config:
    """deploy/worker.yaml through the real loader (schema-validated), no environment."""
    return load_config(path=WORKER_CONFIG, environ={})


def _env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(volumes: list[str]) -> dict[str, str]:
    """Short-syntax volumes 'source:target[:mode]' -> {source: target}."""
    return {v.split(":")[0]: v.split(":")[1] for v in volumes}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert match, f"unsupported duration {duration!r}"
    return int(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def _listeners(value: str) -> dict[str, str]:
    """'NAME://host:port,...' -> {NAME: 'host:port'}."""
    return dict(item.split("://", 1) for item in value.split(","))


def test_every_service_has_an_image_or_a_build(services: dict[str, Any]) -> None:
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


def test_worker_config_file_is_valid(config: Config) -> None:
    assert config.engine.kind == "vllm"
    assert config.kafka.bootstrap_servers == "kafka:19092"


@pytest.mark.parametrize("name", WORKERS)
def test_workers_run_the_mounted_config(services: dict[str, Any], name: str) -> None:
    worker = services[name]
    assert worker["command"] == ["-c", CONFIG_TARGET]
    assert _mounts(worker["volumes"])[f"./{WORKER_CONFIG.relative_to(ROOT)}"] == CONFIG_TARGET


@pytest.mark.parametrize("name", WORKERS)
def test_workers_can_scale_out(services: dict[str, Any], config: Config, name: str) -> None:
    worker = services[name]
    # a fixed container name or host port would clash at --scale worker=2
    assert "container_name" not in worker
    assert "ports" not in worker
    assert [int(p) for p in worker["expose"]] == [config.metrics.port]
    # Prometheus scrapes each replica over the network: not the loopback default
    assert config.metrics.host == "0.0.0.0"
    assert worker["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", WORKERS)
def test_workers_outlast_the_drain_timeout(
    services: dict[str, Any], config: Config, name: str
) -> None:
    assert _seconds(services[name]["stop_grace_period"]) > config.worker.drain_timeout_s


def test_topics_created_match_the_worker_config(services: dict[str, Any], config: Config) -> None:
    init = services["kafka-init"]
    env = _env(init)
    assert (env["REQUESTS_TOPIC"], env["RESULTS_TOPIC"], env["DEAD_LETTER_TOPIC"]) == (
        config.kafka.requests_topic,
        config.kafka.results_topic,
        config.kafka.dead_letter_topic,
    )
    assert env["BOOTSTRAP"] == config.kafka.bootstrap_servers
    script = "\n".join(init["command"])
    assert "/opt/kafka/bin/kafka-topics.sh" in script
    for flag in ("--create", '--partitions "$$PARTITIONS"', '--bootstrap-server "$$BOOTSTRAP"'):
        assert flag in script
    assert f"--replication-factor {config.kafka.replication_factor}" in script
    topic_vars = [name for name in env if name.endswith("_TOPIC")]
    for var in topic_vars:
        assert f'"$${var}"' in script
    # every model's requests topic (kafka.routes) is created too
    created = {env[var] for var in topic_vars}
    assert created == {
        config.kafka.requests_topic,
        config.kafka.results_topic,
        config.kafka.dead_letter_topic,
        *config.kafka.routes.values(),
    }
    assert init["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"]


def test_a_fair_fleet_gets_each_requests_topics_pending_and_state_topics(
    services: dict[str, Any], config: Config
) -> None:
    assert config.scheduling.fair  # the compose stack is a shared service
    script = "\n".join(services["kafka-init"]["command"])
    env = _env(services["kafka-init"])
    requests_vars = [v for v in env if v.endswith("REQUESTS_TOPIC")]
    assert {env[v] for v in requests_vars} == {
        config.kafka.requests_topic,
        *config.kafka.routes.values(),
    }
    for var in requests_vars:
        assert f'"$${var}"' in script.split("scheduling.fair")[1]
    assert '--topic "$$topic.pending" --partitions 1' in script
    assert '--topic "$$topic.feeder-state" --partitions 1' in script
    assert "--config cleanup.policy=compact" in script


def test_topics_created_take_the_largest_record_the_workers_produce(
    services: dict[str, Any], config: Config
) -> None:
    script = "\n".join(services["kafka-init"]["command"])
    allowed = int(re.findall(r"--config max\.message\.bytes=(\d+)", script)[0])
    largest = producer_max_bytes(config.kafka, config.limits) + BATCH_FRAMING_BYTES
    assert allowed == largest


def test_partitions_follow_one_variable(services: dict[str, Any], config: Config) -> None:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert raw["kafka-init"]["environment"]["PARTITIONS"] == "${BATCHPIPE_PARTITIONS:-6}"
    assert int(_env(services["kafka-init"])["PARTITIONS"]) == config.kafka.partitions
    for name in WORKERS:
        assert raw[name]["environment"]["BATCHPIPE_KAFKA__PARTITIONS"] == (
            "${BATCHPIPE_PARTITIONS:-6}"
        )
        # what the worker process sees: its file plus the service's environment
        seen = load_config(path=WORKER_CONFIG, environ=_env(services[name]))
        assert seen.kafka.partitions == config.kafka.partitions


def test_kafka_listeners_serve_workers_and_the_host(
    services: dict[str, Any], config: Config
) -> None:
    env = _env(services["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    bound = _listeners(env["KAFKA_LISTENERS"])
    internal = next(n for n, addr in advertised.items() if addr == config.kafka.bootstrap_servers)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == internal
    assert bound[internal].rsplit(":", 1)[1] == config.kafka.bootstrap_servers.rsplit(":", 1)[1]
    host_name, host_addr = next((n, a) for n, a in advertised.items() if a.startswith("localhost:"))
    host_port = host_addr.rsplit(":", 1)[1]
    assert bound[host_name] == f":{host_port}"
    assert f"{host_port}:{host_port}" in services["kafka"]["ports"]
    protocol_map = dict(
        item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert set(protocol_map) == set(bound)
    assert set(advertised) | {env["KAFKA_CONTROLLER_LISTENER_NAMES"]} == set(bound)
    if config.kafka.delivery == "exactly_once":
        # transactions need their state log; one broker can hold one replica of it
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"


def test_each_model_has_a_group_and_topic_and_all_share_the_results_topic(
    services: dict[str, Any], config: Config
) -> None:
    """The chat model, the embedding model and the GPU model, as each worker process loads
    its configuration: routed, distinct, answering on one results topic."""
    seen = {name: load_config(path=WORKER_CONFIG, environ=_env(services[name])) for name in WORKERS}
    for name, worker in seen.items():
        assert served_route_problem(worker) is None, name
        assert worker.kafka.routes == config.kafka.routes
        assert worker.kafka.results_topic == config.kafka.results_topic
    for setting in ("group_id", "requests_topic"):
        assert len({getattr(w.kafka, setting) for w in seen.values()}) == len(WORKERS), setting
    assert len({w.engine.model for w in seen.values()}) == len(WORKERS)
    assert seen["worker-embed"].engine.task == "embed"
    assert "profiles" not in services["worker-embed"]  # both CPU models run by default
    # publishers (submit, the api) route exactly the models the groups serve
    table = RoutingTable.from_kafka(config.kafka)
    assert {table.topic_for(w.engine.model) for w in seen.values()} == set(table.topics)
    assert _mounts(services["api"]["volumes"])[f"./{WORKER_CONFIG.relative_to(ROOT)}"] == (
        CONFIG_TARGET
    )


def test_gpu_worker_is_opt_in_and_requests_nvidia_gpus(services: dict[str, Any]) -> None:
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert [n for n, s in services.items() if "profiles" in s] == ["worker-gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert gpu["build"]["dockerfile"] == "Dockerfile.gpu"
    seen = load_config(path=WORKER_CONFIG, environ=_env(gpu))
    assert (seen.engine.kind, seen.engine.device) == ("trtllm", "cuda")


def test_prometheus_discovers_every_worker_replica(
    services: dict[str, Any], config: Config
) -> None:
    mounts = _mounts(services["prometheus"]["volumes"])
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    discovered: set[str] = set()
    for job in prometheus["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            assert job["metrics_path"] == "/metrics"
            assert sd["port"] == config.metrics.port
            assert sd["type"] == "A"  # one target per replica address
            discovered.update(sd["names"])
    assert discovered == set(WORKERS)


def test_grafana_is_provisioned_from_the_mounted_folders(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    mounts = _mounts(grafana["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    providers = yaml.safe_load((provisioning / "dashboards" / "batchpipe.yml").read_text())
    (provider,) = providers["providers"]
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus"
    assert source["uid"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]


def test_api_serves_the_worker_config_with_keys_from_the_environment(
    services: dict[str, Any], config: Config
) -> None:
    api = services["api"]
    assert api["entrypoint"] == ["batchpipe", "serve"]
    assert api["command"] == ["-c", CONFIG_TARGET, "--host", "0.0.0.0"]
    assert _mounts(api["volumes"])[f"./{WORKER_CONFIG.relative_to(ROOT)}"] == CONFIG_TARGET
    assert api["environment"]["BATCHPIPE_API_KEYS"].startswith("${BATCHPIPE_API_KEYS:?")
    assert f"{config.api.port}:{config.api.port}" in api["ports"]
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
