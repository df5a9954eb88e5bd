"""The e2e tests' broker: ``batchpipe broker`` in its own process, one per test module
(``KAFKA_BOOTSTRAP`` names another for the whole session)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.cli import BATCHPIPE, ROOT


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """``batchpipe broker`` in its own process; its first stdout line is the address."""
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    process = subprocess.Popen(
        [*BATCHPIPE, "broker", "--port", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert process.stdout is not None
    address = process.stdout.readline().strip()
    assert address.startswith("127.0.0.1:"), address
    yield address
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
