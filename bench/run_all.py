"""``make bench``: every benchmark, each in a process of its own, then charts and figures.

A process per benchmark keeps them from disturbing one another (torch threads, a loaded
model, a broker left behind); the charts (:mod:`bench.plot`) are drawn last, in one more,
and the figures of README.md and bench/README.md are rendered from the results
(:mod:`bench.tables`).
A failing benchmark is reported and the rest still run; the exit code is non-zero if any
failed. The durations of a full run go to ``bench/results/run_all.json``.

    .venv/bin/python -m bench.run_all [--only overhead,wire]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import write_result

BENCH = Path(__file__).resolve().parent
# overhead before wire: wire quotes the worker's stage shares that overhead measured
BENCHMARKS = (
    "batcher_echo",
    "formation",
    "engine_cpu",
    "vllm_direct",
    "overhead",
    "wire",
    "realtime",
    "adaptive",
    "api",
    "inflight",
    "structured",
    "embeddings",
    "broker_earliest",
    "latency",
    "fairness",
    "remote",
)


def available() -> list[str]:
    """The benchmarks whose module is present in this checkout."""
    return [name for name in BENCHMARKS if (BENCH / f"{name}.py").exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    chosen = [n for n in args.only.split(",") if n] or available()
    unknown = sorted(set(chosen) - set(available()))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {available()}")
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    for name in chosen:
        print(f"== bench.{name}", flush=True)
        t0 = time.monotonic()
        code = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=BENCH.parent).returncode
        runs.append({"name": name, "seconds": round(time.monotonic() - t0, 1), "exit_code": code})
        print(f"== bench.{name}: exit {code} after {runs[-1]['seconds']} s", flush=True)
    total = round(time.monotonic() - started, 1)
    if not args.only:  # the record of a full `make bench`, not of a partial rerun
        write_result("run_all", {"benchmarks": runs, "total_seconds": total})
    failed = [r["name"] for r in runs if r["exit_code"] != 0]
    for step in ("plot", "tables"):
        if subprocess.run([sys.executable, "-m", f"bench.{step}"], cwd=BENCH.parent).returncode:
            failed.append(step)
    print(f"== {len(runs)} benchmarks in {total} s" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
