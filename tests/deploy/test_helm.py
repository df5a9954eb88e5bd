"""The Helm chart, rendered and linted by Helm itself (Helm 4 embedded in helm-python-sdk).

No cluster is involved: ``Chart.render`` is ``helm template`` and ``lint`` is ``helm lint``.
The rendered worker configuration is loaded with the worker's own loader, so the chart and
the worker agree on file layout and environment variable names.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests import ROOT
from worker.config import Config, load_config
from worker.routing import RoutingTable, served_route_problem

CHART = ROOT / "helm" / "batchpipe"
GPU_KEDA_VALUES = CHART / "ci" / "gpu-keda-values.yaml"
CONFIG_PATH = "/etc/batchpipe/worker.yaml"

Manifest = dict[str, Any]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _ci_values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(GPU_KEDA_VALUES.read_text())
    return loaded


def _render(chart: helm.Chart, values: dict[str, Any] | None = None) -> list[Manifest]:
    rendered = chart.render(values=values, name="bp", namespace="ml", is_install=True)
    docs: list[Manifest] = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def _one(docs: list[Manifest], kind: str) -> Manifest:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _container(docs: list[Manifest]) -> Manifest:
    containers: list[Manifest] = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["worker"]
    return containers[0]


def _load_worker_config(docs: list[Manifest], tmp_path: Path) -> Config:
    """The configuration a pod would load: the ConfigMap file plus the container's env.

    Values that come from Secrets or the downward API are stood in for by their source,
    as the kubelet would resolve them.
    """
    file = tmp_path / "worker.yaml"
    file.write_text(_one(docs, "ConfigMap")["data"]["worker.yaml"])
    environ: dict[str, str] = {}
    for var in _container(docs)["env"]:
        if "value" in var:
            environ[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            environ[var["name"]] = f"{ref['name']}/{ref['key']}"
        else:
            environ[var["name"]] = "bp-batchpipe-7d9c-x2x4z"
    return load_config(path=file, environ=environ)


def _lint_errors(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    report = helm.lint(CHART, values=values, strict=True, kube_version="v1.31.0")
    messages: list[dict[str, Any]] = report["messages"]
    return [m for m in messages if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]


@pytest.mark.parametrize("values", [None, _ci_values()], ids=["default", "gpu-keda"])
def test_chart_lints_clean(values: dict[str, Any] | None) -> None:
    assert _lint_errors(values) == []


def test_default_render_is_a_cpu_deployment_without_optional_objects(chart: helm.Chart) -> None:
    docs = _render(chart)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    deployment = _one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == chart.values["replicaCount"]
    limits = _container(docs)["resources"]["limits"]
    assert "nvidia.com/gpu" not in limits


@pytest.mark.parametrize("overrides", [None, _ci_values()], ids=["default", "gpu-keda"])
def test_configmap_holds_values_config_and_is_mounted(
    chart: helm.Chart, overrides: dict[str, Any] | None
) -> None:
    docs = _render(chart, overrides)
    effective = chart.merge_values(overrides)["config"]
    assert yaml.safe_load(_one(docs, "ConfigMap")["data"]["worker.yaml"]) == effective

    container = _container(docs)
    assert container["args"] == ["-c", CONFIG_PATH]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == CONFIG_PATH)
    volumes = _one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    volume = next(v for v in volumes if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == _one(docs, "ConfigMap")["metadata"]["name"]
    assert mount["subPath"] == "worker.yaml"


def test_config_checksum_annotation_follows_the_configmap(chart: helm.Chart) -> None:
    def checksum_and_configmap(values: dict[str, Any] | None) -> tuple[str, str]:
        rendered = chart.render(values=values, name="bp", namespace="ml")
        deployment = yaml.safe_load(rendered["batchpipe/templates/deployment.yaml"])
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/config"], rendered["batchpipe/templates/configmap.yaml"]

    default_sum, configmap = checksum_and_configmap(None)
    assert default_sum == hashlib.sha256(configmap.encode()).hexdigest()
    changed_sum, _ = checksum_and_configmap({"config": {"batching": {"max_batch_size": 8}}})
    assert changed_sum != default_sum


def test_rendered_config_loads_with_the_worker_loader(chart: helm.Chart, tmp_path: Path) -> None:
    config = _load_worker_config(_render(chart), tmp_path)
    assert config.kafka.bootstrap_servers == chart.values["kafka"]["bootstrapServers"]
    assert config.kafka.client == {"security.protocol": "PLAINTEXT"}
    assert config.engine.kind == "vllm"
    assert config.worker.worker_id == "bp-batchpipe-7d9c-x2x4z"


def test_sasl_and_tls_come_from_existing_secrets(chart: helm.Chart, tmp_path: Path) -> None:
    values = _ci_values()
    docs = _render(chart, values)
    config = _load_worker_config(docs, tmp_path)
    sasl, tls = values["kafka"]["sasl"], values["kafka"]["tls"]
    assert dict(config.kafka.client) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": f"{sasl['existingSecret']}/{sasl['usernameKey']}",
        "sasl.password": f"{sasl['existingSecret']}/{sasl['passwordKey']}",
        "ssl.ca.location": f"/etc/batchpipe/kafka-ca/{tls['caKey']}",
    }
    # the CA file lies in a volume of the TLS secret, mounted where ssl.ca.location points
    container = _container(docs)
    ca_dir = str(Path(config.kafka.client["ssl.ca.location"]).parent)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == ca_dir)
    volumes = _one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    secret = next(v for v in volumes if v["name"] == mount["name"])["secret"]
    assert secret["secretName"] == tls["existingSecret"]
    assert secret["items"] == [{"key": tls["caKey"], "path": tls["caKey"]}]
    # credentials are referenced, never rendered: no literal value, no Secret of the chart's
    credentials = [
        v for v in container["env"] if "SASL_USERNAME" in v["name"] or "SASL_PASSWORD" in v["name"]
    ]
    assert len(credentials) == 2
    assert all(set(v) == {"name", "valueFrom"} for v in credentials)
    assert all(doc["kind"] != "Secret" for doc in docs)


def test_sasl_without_a_secret_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="existingSecret"):
        _render(chart, {"kafka": {"sasl": {"enabled": True}}})


@pytest.mark.parametrize("overrides", [None, _ci_values()], ids=["default", "gpu-keda"])
def test_probes_and_service_use_the_metrics_port(
    chart: helm.Chart, overrides: dict[str, Any] | None
) -> None:
    docs = _render(chart, overrides)
    port = chart.merge_values(overrides)["config"]["metrics"]["port"]
    container = _container(docs)
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    probes = {
        name: container[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/healthz", "port": "metrics"},
        "livenessProbe": {"path": "/healthz", "port": "metrics"},
        "readinessProbe": {"path": "/readyz", "port": "metrics"},
    }
    service_port = _one(docs, "Service")["spec"]["ports"][0]
    assert (service_port["port"], service_port["targetPort"]) == (port, "metrics")


@pytest.mark.parametrize("overrides", [None, _ci_values()], ids=["default", "gpu-keda"])
def test_startup_probe_covers_model_loading_and_liveness_follows_the_worker_setting(
    chart: helm.Chart, overrides: dict[str, Any] | None, tmp_path: Path
) -> None:
    docs = _render(chart, overrides)
    container = _container(docs)
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    # /healthz answers 503 until the worker loop first runs: loading the model must fit in
    # the startup probe's budget, and liveness must not start before the startup probe passed
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert "initialDelaySeconds" not in liveness
    config = _load_worker_config(docs, tmp_path)
    values = chart.merge_values(overrides)["config"]["worker"]
    assert config.worker.liveness_timeout_s == values["liveness_timeout_s"] == 60


@pytest.mark.parametrize("overrides", [None, _ci_values()], ids=["default", "gpu-keda"])
def test_metrics_listen_on_every_interface_of_the_pod(
    chart: helm.Chart, overrides: dict[str, Any] | None, tmp_path: Path
) -> None:
    # the worker's own default is loopback, which the kubelet and Prometheus cannot reach
    config = _load_worker_config(_render(chart, overrides), tmp_path)
    assert config.metrics.host == "0.0.0.0"


@pytest.mark.parametrize("drain", [30, 120, 30.5])
def test_termination_grace_exceeds_the_drain_timeout(chart: helm.Chart, drain: float) -> None:
    docs = _render(chart, {"config": {"worker": {"drain_timeout_s": drain}}})
    grace = _one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    margin = chart.values["terminationGraceMarginSeconds"]
    assert grace == math.ceil(drain) + margin
    assert grace > drain


def test_gpu_fleet_requests_gpus_on_gpu_nodes(chart: helm.Chart) -> None:
    values = _ci_values()
    docs = _render(chart, values)
    container = _container(docs)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == values["gpu"]["count"]
    assert container["resources"]["limits"]["memory"] == values["resources"]["limits"]["memory"]
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert yaml.safe_load(_one(docs, "ConfigMap")["data"]["worker.yaml"])["engine"]["kind"] == (
        "trtllm"
    )


def test_keda_scales_on_lag_of_the_requests_topic(chart: helm.Chart) -> None:
    values = _ci_values()
    docs = _render(chart, values)
    config = chart.merge_values(values)["config"]
    scaled = _one(docs, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"]["name"] == _one(docs, "Deployment")["metadata"]["name"]
    assert scaled["minReplicaCount"] <= scaled["maxReplicaCount"] <= config["kafka"]["partitions"]
    # fair share (the default): the backlog waits on the pending topic, the feeder's lag
    assert config["scheduling"]["fair"]
    trigger, pending = scaled["triggers"]
    assert trigger["type"] == pending["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["topic"] == config["kafka"]["requests_topic"]
    assert meta["consumerGroup"] == config["kafka"]["group_id"]
    assert meta["bootstrapServers"] == values["kafka"]["bootstrapServers"]
    assert (meta["sasl"], meta["tls"], meta["allowIdleConsumers"]) == (
        "scram_sha512",
        "enable",
        "false",
    )
    waiting = pending["metadata"]
    assert waiting["topic"] == config["kafka"]["requests_topic"] + ".pending"
    assert waiting["consumerGroup"] == config["kafka"]["group_id"] + ".feeder"
    assert waiting["allowIdleConsumers"] == "true"  # one partition, many workers
    auth = _one(docs, "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert pending["authenticationRef"] == trigger["authenticationRef"]
    assert {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]} == {
        "username",
        "password",
        "ca",
    }
    # KEDA owns the replica count: the Deployment must not fight it on upgrade
    assert "replicas" not in _one(docs, "Deployment")["spec"]
    monitor = _one(docs, "ServiceMonitor")["spec"]
    assert monitor["endpoints"][0]["port"] == "metrics"
    assert monitor["selector"]["matchLabels"] == _one(docs, "Service")["spec"]["selector"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"keda": {"enabled": True, "maxReplicaCount": 7}}, "maxReplicaCount \\(7\\) exceeds"),
        ({"replicaCount": 7}, "replicaCount \\(7\\) exceeds"),
    ],
)
def test_more_workers_than_partitions_is_refused(
    chart: helm.Chart, overrides: dict[str, Any], message: str
) -> None:
    assert chart.merge_values(overrides)["config"]["kafka"]["partitions"] == 6
    with pytest.raises(helm.HelmRenderError, match=message):
        _render(chart, overrides)
    # the same counts fit once there are enough partitions
    _render(chart, {**overrides, "config": {"kafka": {"partitions": 7}}})


def test_keda_without_fair_share_scales_on_the_requests_topic_alone(chart: helm.Chart) -> None:
    values = _ci_values()
    values["config"] = {**values.get("config", {}), "scheduling": {"fair": False}}
    (trigger,) = _one(_render(chart, values), "ScaledObject")["spec"]["triggers"]
    assert (
        trigger["metadata"]["topic"]
        == chart.merge_values(values)["config"]["kafka"]["requests_topic"]
    )


def test_keda_minimum_above_maximum_is_refused(chart: helm.Chart) -> None:
    overrides = {"keda": {"enabled": True, "minReplicaCount": 5, "maxReplicaCount": 4}}
    with pytest.raises(helm.HelmRenderError, match="minReplicaCount \\(5\\) exceeds"):
        _render(chart, overrides)


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"gpu": {"enabled": "yes"}}, "/gpu/enabled"),
        ({"config": {"metrics": {"port": 70000}}}, "/config/metrics/port"),
        ({"config": {"metrics": {"enabled": False}}}, "/config/metrics/enabled"),
        ({"config": {"metrics": {"host": "127.0.0.1"}}}, "/config/metrics/host"),
        ({"model": {"volume": {"type": "nfs"}}}, "/model/volume/type"),
        ({"kafka": {"sasl": {"mechanism": "GSSAPI"}}}, "/kafka/sasl/mechanism"),
        ({"replicaCount": -1}, "/replicaCount"),
    ],
)
def test_schema_rejects_bad_values(
    chart: helm.Chart, overrides: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(overrides)
    with pytest.raises(helm.HelmValuesError, match=where):
        _render(chart, overrides)


@pytest.mark.parametrize(
    ("volume", "expected"),
    [
        ({"type": "emptyDir"}, {"emptyDir": {}}),
        (
            {"type": "persistentVolumeClaim", "persistentVolumeClaim": {"claimName": "llm"}},
            {"persistentVolumeClaim": {"claimName": "llm", "readOnly": False}},
        ),
        (
            {"type": "hostPath", "hostPath": {"path": "/srv/models"}},
            {"hostPath": {"path": "/srv/models", "type": "Directory"}},
        ),
    ],
)
def test_model_volume_kinds(
    chart: helm.Chart, volume: Mapping[str, Any], expected: Mapping[str, Any]
) -> None:
    docs = _render(chart, {"model": {"volume": dict(volume)}})
    volumes = _one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    models = next(v for v in volumes if v["name"] == "models")
    assert {k: v for k, v in models.items() if k != "name"} == expected
    mount = next(m for m in _container(docs)["volumeMounts"] if m["name"] == "models")
    assert mount["mountPath"] == "/models"


def test_a_claim_volume_needs_a_claim_name(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match="claimName is required"):
        _render(chart, {"model": {"volume": {"type": "persistentVolumeClaim"}}})


def test_api_is_an_optional_deployment_and_service_with_probes(
    chart: helm.Chart, tmp_path: Path
) -> None:
    values = {"api": {"enabled": True, "keysSecret": "api-keys"}}
    assert _lint_errors(values) == []
    docs = _render(chart, values)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    api = deployments["bp-batchpipe-api"]
    worker = deployments["bp-batchpipe"]
    api_labels = api["spec"]["template"]["metadata"]["labels"]
    selector = worker["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= api_labels.items(), "the workers would select api pods"
    container = api["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["batchpipe", "serve"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["BATCHPIPE_API__KEYS_FILE"] == "/etc/batchpipe/api-keys/keys"
    services = {s["metadata"]["name"]: s for s in docs if s["kind"] == "Service"}
    assert services["bp-batchpipe-api"]["spec"]["selector"].items() <= api_labels.items()
    file = tmp_path / "worker.yaml"
    file.write_text(_one(docs, "ConfigMap")["data"]["worker.yaml"])
    environ = {k: v for k, v in env.items() if v is not None}
    assert load_config(path=file, environ=environ).api.keys_file.endswith("/keys")


def test_api_without_a_keys_secret_is_refused(chart: helm.Chart) -> None:
    with pytest.raises(Exception, match="keysSecret"):
        _render(chart, {"api": {"enabled": True}})


TWO_MODELS = {
    "chat": CHART / "ci" / "two-models-chat-values.yaml",
    "embed": CHART / "ci" / "two-models-embed-values.yaml",
}


def _release(chart: helm.Chart, name: str, tmp_path: Path) -> tuple[list[Manifest], Config]:
    """One release of the two-model fleet: its manifests and its workers' configuration."""
    values = yaml.safe_load(TWO_MODELS[name].read_text())
    assert _lint_errors(values) == []
    rendered = chart.render(values=values, name=name, namespace="ml", is_install=True)
    docs = [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    workers = [d for d in docs if d["kind"] == "Deployment" and "-api" not in d["metadata"]["name"]]
    file = tmp_path / f"{name}.yaml"
    file.write_text(_one(docs, "ConfigMap")["data"]["worker.yaml"])
    (worker,) = workers
    env = worker["spec"]["template"]["spec"]["containers"][0]["env"]
    environ = {v["name"]: str(v["value"]) for v in env if "value" in v}
    return docs, load_config(path=file, environ=environ)


def test_two_models_are_two_releases_with_a_group_and_topic_each(
    chart: helm.Chart, tmp_path: Path
) -> None:
    releases = {name: _release(chart, name, tmp_path) for name in TWO_MODELS}
    configs = {name: config for name, (_, config) in releases.items()}
    for name, (docs, config) in releases.items():
        # each group reads the topic its model is routed to, and scales on that topic's lag
        assert served_route_problem(config) is None, name
        trigger, *pending = _one(docs, "ScaledObject")["spec"]["triggers"]
        assert trigger["metadata"]["topic"] == config.kafka.requests_topic
        assert trigger["metadata"]["consumerGroup"] == config.kafka.group_id
        # with fair share, each model's own pending topic and feeder group too
        expected = [f"{config.kafka.requests_topic}.pending"] if config.scheduling.fair else []
        assert [p["metadata"]["topic"] for p in pending] == expected
    chat, embed = configs["chat"], configs["embed"]
    assert (chat.engine.task, embed.engine.task) == ("generate", "embed")
    assert chat.engine.model != embed.engine.model
    assert chat.kafka.group_id != embed.kafka.group_id
    assert chat.kafka.requests_topic != embed.kafka.requests_topic
    assert chat.kafka.results_topic == embed.kafka.results_topic  # collect finds every answer
    assert chat.kafka.routes == embed.kafka.routes
    # the API (in the chat release) routes exactly the models the two groups serve
    api_names = [d["metadata"]["name"] for d in releases["chat"][0] if d["kind"] == "Deployment"]
    assert "chat-batchpipe-api" in api_names
    table = RoutingTable.from_kafka(chat.kafka)
    assert {table.topic_for(c.engine.model) for c in configs.values()} == set(table.topics)
    # the two releases' objects neither clash nor select each other's pods
    names = [{(d["kind"], d["metadata"]["name"]) for d in docs} for docs, _ in releases.values()]
    assert not names[0] & names[1]
