"""The chaos suite's report: one row per scenario, written where ``BATCHPIPE_CHAOS_REPORT`` says.

``bench/results/chaos.json`` is such a report from a real run; ``bench/tables.py``
renders docs/guarantees.md's table from it. Writing replaces the file with the
scenarios of this run only, so a report never mixes runs of different code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import machine

REPORT_ENV = "BATCHPIPE_CHAOS_REPORT"
#: The command that writes the committed report.
COMMAND = (
    "BATCHPIPE_CHAOS_REPORT=bench/results/chaos.json "
    '.venv/bin/python -m pytest tests/integration -k "chaos or sigkill"'
)


@dataclass(frozen=True)
class ScenarioReport:
    """What one scenario measured.

    ``answered``: requests with exactly one answer in ``collect``'s output (dead letters
    counted for records without a recoverable ``custom_id``); ``collect_duplicates``:
    lines of that output beyond one per ``custom_id``; ``raw_duplicates``: records on
    the results and dead-letter topics beyond one per request (Tansu delivers aborted
    transactions); ``restarts``: workers killed and started again; ``longest_stall_s``:
    the longest time no new answer arrived; ``lag_zero_s``: from the last answer until
    the group's committed offsets reached the end of every partition.
    """

    scenario: str
    requests: int
    answered: int
    collect_duplicates: int
    raw_duplicates: int
    restarts: int
    longest_stall_s: float
    lag_zero_s: float


class ChaosReport:
    def __init__(self) -> None:
        self.scenarios: list[ScenarioReport] = []

    def add(self, row: ScenarioReport) -> None:
        print(f"\nchaos: {row}")
        self.scenarios.append(row)

    def write(self, path: Path) -> None:
        rows = [
            {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(row).items()}
            for row in self.scenarios
        ]
        payload = {"machine": machine(), "command": COMMAND, "scenarios": rows}
        path.write_text(json.dumps(payload, indent=2) + "\n")


def report_path() -> Path | None:
    value = os.environ.get(REPORT_ENV)
    return Path(value) if value else None
