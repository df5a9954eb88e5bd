"""A fleet of ``batchpipe worker`` processes for chaos tests: start, stop, kill, probe.

Each member serves its metrics and health endpoints on a port of its own, so a test
can watch one worker (``/metrics``) or probe it as an orchestrator would
(``/healthz``). The fleet remembers which members a test ended on purpose, so
:meth:`Fleet.assert_alive` can tell a crash from a kill.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import start_worker_process

Metrics = Mapping[str, float]

_PROBE_TIMEOUT_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Member:
    """One worker process and the port of its HTTP endpoints."""

    process: subprocess.Popen[bytes]
    port: int
    ended_on_purpose: bool = field(default=False)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def healthz(self) -> int:
        """The HTTP status of ``/healthz``; 0 while nothing answers on the port."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/healthz", timeout=_PROBE_TIMEOUT_S
            ) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def metrics(self) -> Metrics:
        """Every sample of ``/metrics`` by ``name{label="value",…}``, and summed over its
        labels by ``name``; empty while nothing answers on the port."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/metrics", timeout=_PROBE_TIMEOUT_S
            ) as response:
                text = response.read().decode()
        except OSError:
            return {}
        sums: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                if sample.labels:
                    labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                    sums[f"{sample.name}{{{labels}}}"] = sample.value
        return sums


class Fleet:
    """Worker processes sharing one configuration file (one consumer group)."""

    def __init__(self, config_path: Path) -> None:
        self._config_path = config_path
        self.members: list[Member] = []
        self.restarts = 0

    def start(self, *sets: str) -> Member:
        """A new worker process; ``sets`` are extra ``--set section.key=value`` overrides."""
        port = free_port()
        process = start_worker_process(self._config_path, f"metrics.port={port}", *sets)
        member = Member(process, port)
        self.members.append(member)
        return member

    def stop(self, member: Member, timeout_s: float) -> int:
        """SIGTERM ``member`` and wait for it; returns its exit status."""
        member.ended_on_purpose = True
        member.process.send_signal(signal.SIGTERM)
        return member.process.wait(timeout_s)

    def kill(self, member: Member) -> None:
        member.ended_on_purpose = True
        member.process.send_signal(signal.SIGKILL)
        member.process.wait(30)

    def pause(self, member: Member) -> None:
        """SIGSTOP ``member``: frozen, as in a long GC pause; its heartbeats stop too."""
        member.process.send_signal(signal.SIGSTOP)

    def resume(self, member: Member) -> None:
        """SIGCONT ``member`` after :meth:`pause`."""
        member.process.send_signal(signal.SIGCONT)

    def restart(self, member: Member, *sets: str) -> Member:
        """Kill ``member`` and start its replacement, as an orchestrator restarts a pod."""
        self.kill(member)
        self.restarts += 1
        return self.start(*sets)

    def wait(
        self, member: Member, done: Callable[[Metrics], bool], timeout_s: float, what: str
    ) -> None:
        """Scrape ``member`` until ``done(metrics)``; fail after ``timeout_s``, or when
        the member exits first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert member.running, f"worker exited with {member.process.returncode}: {what}"
            if done(member.metrics()):
                return
            time.sleep(0.2)  # polling a condition with a bound
        raise AssertionError(f"not within {timeout_s:g} s: {what}")

    def wait_unhealthy(self, member: Member, timeout_s: float) -> None:
        """Probe ``/healthz`` as a liveness probe does until it answers 503, or until the
        process exits on its own; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while member.running and member.healthz() != 503:
            assert time.monotonic() < deadline, f"/healthz still passing after {timeout_s:g} s"
            time.sleep(0.5)  # a probe period, polling a condition with a bound

    def assert_alive(self) -> None:
        """Every member the test did not end on purpose is still running."""
        dead = [
            (m.process.pid, m.process.returncode)
            for m in self.members
            if not m.ended_on_purpose and not m.running
        ]
        assert not dead, f"workers died (pid, exit status): {dead}"

    def close(self) -> None:
        """SIGTERM what still runs, then SIGKILL what does not exit."""
        running = [m for m in self.members if m.running]
        for member in running:
            member.process.send_signal(signal.SIGTERM)
        for member in running:
            try:
                member.process.wait(60)
            except subprocess.TimeoutExpired:
                member.process.kill()
                member.process.wait(10)


@contextmanager
def fleet(config_path: Path) -> Iterator[Fleet]:
    workers = Fleet(config_path)
    try:
        yield workers
    finally:
        workers.close()


def busy(metrics: Metrics) -> bool:
    """The worker holds requests it has not answered yet (a batch is running or queued)."""
    return metrics.get("batchpipe_inflight_requests", 0.0) > 0


def assignments(metrics: Metrics) -> float:
    """How many assignments the worker has served."""
    return metrics.get('batchpipe_rebalances_total{kind="assign"}', 0.0)


def assigned(metrics: Metrics) -> bool:
    """The worker has been assigned partitions at least once."""
    return metrics.get('batchpipe_rebalances_total{kind="assign"}', 0.0) > 0
