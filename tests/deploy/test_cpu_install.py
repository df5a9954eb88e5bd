"""``deploy/cpu_install.py torch``, the index choice of ``make venv`` and the CPU image, run
against two indexes on 127.0.0.1: one that accepts connections and never answers, and a
PEP 503 index serving a stand-in ``torch-2.13.0+cpu`` wheel built here.

pip runs with no configuration file and none of the ``PIP_*`` variables of this machine
(whose pip reads a local wheel directory holding the real torch), so what it installs can
only have come from the index under test.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ROOT

SCRIPT = ROOT / "deploy" / "cpu_install.py"
CONSTRAINTS = ROOT / "constraints-cpu.txt"
WHEEL = "torch-2.13.0+cpu-py3-none-any.whl"
#: a bound on one run of the script, never an expectation of its speed
RUN_BOUND_S = 120


def _isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "torch", "--constraints", str(CONSTRAINTS), *args],
        capture_output=True,
        text=True,
        env=_isolated_env(),
        timeout=RUN_BOUND_S,
        check=False,
    )


@pytest.fixture()
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    """A port that accepts connections and never sends a byte; the list holds each one."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed by the fixture
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(), which close() does not
    server.close()
    thread.join(5)
    for conn in accepted:
        conn.close()


def test_an_index_that_does_not_answer_falls_back_after_one_probe(
    silent_port: tuple[int, list[socket.socket]],
) -> None:
    port, accepted = silent_port
    index = f"http://127.0.0.1:{port}/whl/cpu"
    done = _run("--index", index, "--timeout", "0.5")
    assert done.returncode == 0, done.stderr
    assert f"{index} did not answer within 0.5s" in done.stdout
    assert "torch comes from pip's configured sources" in done.stdout
    # one connection: the probe's; pip never asked the index (it would retry per package)
    assert len(accepted) == 1


def test_the_image_refuses_an_index_that_does_not_answer(
    silent_port: tuple[int, list[socket.socket]],
) -> None:
    port, accepted = silent_port
    done = _run("--index", f"http://127.0.0.1:{port}/whl/cpu", "--timeout", "0.5", "--require")
    assert done.returncode == 1
    assert "did not answer" in done.stderr
    assert len(accepted) == 1


def _stand_in_wheel(path: Path) -> None:
    """A pure-Python wheel named like PyTorch's CPU build, its module saying what it is."""
    info = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": '__version__ = "2.13.0+cpu"\nSTAND_IN = True\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: batchpipe-test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{info}/RECORD", record)


@pytest.fixture()
def local_index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A PEP 503 simple index on 127.0.0.1 holding the stand-in wheel; the list holds each
    path asked for."""
    root = tmp_path / "index"
    (root / "simple" / "torch").mkdir(parents=True)
    _stand_in_wheel(root / WHEEL)
    link = f'<a href="../../{WHEEL.replace("+", "%2B")}">{WHEEL}</a>'
    (root / "simple" / "torch" / "index.html").write_text(f"<html><body>{link}</body></html>")
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple", asked
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_an_index_that_answers_serves_torch(
    local_index: tuple[str, list[str]], tmp_path: Path
) -> None:
    index, asked = local_index
    target = tmp_path / "target"
    done = _run("--index", index, "--", "-q", "--no-cache-dir", "--target", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"torch: the CPU build from {index}" in done.stdout
    assert (target / "torch-2.13.0+cpu.dist-info").is_dir()
    assert "STAND_IN = True" in (target / "torch" / "__init__.py").read_text()
    assert "/simple/torch/" in asked  # the probe and pip's own lookup
    assert f"/{WHEEL.replace('+', '%2B')}" in asked
