"""The worker's CPU per request, this checkout against other builds of it, in one run.

Each build is a source tree, ``--tree NAME=DIR``, the first one the base the others are
compared with: a checkout (``.`` is this one), a copy whose hot modules mypyc compiled in
place (their ``.so`` imported before their ``.py``), or a prototype of another way to
write the hot path (issue 42: msgspec Structs in place of dataclasses).
Each round runs :mod:`bench.overhead`'s ``worker, defaults`` and ``worker,
realistic prompts`` variants once per build, each build in a process of its own (its own
embedded broker) with the tree first on ``PYTHONPATH``; the order of the builds rotates
from round to round so that the machine's drift falls on all. Medians over rounds, and
each build / base as ratios.

    .venv/bin/python -m bench.builds --tree NAME=DIR --tree NAME=DIR [...] [--rounds 3]
        [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import write_result

FIGURES = ("loop", "process_stat")


def compiled_modules() -> list[str]:
    """The modules of this interpreter's ``batcher`` and ``worker`` loaded from a ``.so``."""
    return sorted(
        name
        for name, module in sys.modules.items()
        if name.split(".")[0] in ("batcher", "worker")
        and str(getattr(module, "__file__", "") or "").endswith(".so")
    )


def one(total: int) -> dict[str, Any]:
    """In the build's own process: the two variants, and which modules were compiled."""
    from bench.overhead import MAX_TOKENS, Variant, realistic_requests, through_worker
    from bench.wire import summary_requests
    from tests.integration.harness import publish_raw
    from worker.kafka.broker import EmbeddedBroker
    from worker.wire.codec import encode_request

    variants = [
        Variant("defaults", [encode_request(r) for r in summary_requests(total, MAX_TOKENS)]),
        Variant(
            "realistic",
            [encode_request(r) for r in realistic_requests(total, MAX_TOKENS)],
        ),
    ]
    rows: dict[str, Any] = {}
    with EmbeddedBroker() as broker:
        for variant in variants:
            config = variant.config(broker.bootstrap)
            publish_raw(config, variant.records)
            worker = through_worker(config, total)
            window = worker.engine.watch.window  # type: ignore[attr-defined]
            rows[variant.name] = window.figures()
    return {"compiled_modules": compiled_modules(), "variants": rows}


def _run(tree: Path, total: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = f"import json; from bench.builds import one; print(json.dumps(one({total})))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: exit {out.returncode}\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6000)
    args = parser.parse_args(argv)
    trees: dict[str, Path] = {}
    for given in args.tree:
        name, _, tree = given.partition("=")
        if not name or not tree or name in trees:
            parser.error(f"--tree {given!r}: give NAME=DIR, each NAME once")
        trees[name] = Path(tree).resolve()
    if len(trees) < 2:
        parser.error("give at least two --tree: a base and one to compare with it")
    runs: dict[str, list[dict[str, Any]]] = {build: [] for build in trees}
    modules: dict[str, list[str]] = {}
    names = list(trees)
    base = names[0]
    for i in range(args.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for build in order:
            result = _run(trees[build], args.requests)
            modules[build] = result["compiled_modules"]
            runs[build].append(result["variants"])
            print(build, json.dumps(result["variants"]), flush=True)
    median: dict[str, dict[str, dict[str, float]]] = {}
    for build, rounds in runs.items():
        median[build] = {}
        for variant in rounds[0]:
            rows = [r[variant] for r in rounds]
            figures = {
                f: statistics.median(r["cpu_us_per_request"][f] for r in rows) for f in FIGURES
            }
            figures["requests_per_s"] = statistics.median(r["requests_per_s"] for r in rows)
            median[build][variant] = figures
    ratios = {
        build: {
            variant: {
                f: round(median[build][variant][f] / median[base][variant][f], 3)
                for f in (*FIGURES, "requests_per_s")
            }
            for variant in median[base]
        }
        for build in names[1:]
    }
    figures = {
        "requests": args.requests,
        "rounds": args.rounds,
        "trees": {build: str(tree) for build, tree in trees.items()},
        "compiled_modules": modules,
        "median_cpu_us_per_request_and_requests_per_s": median,
        "base": base,
        "over_base": ratios,
        "runs": runs,
    }
    path = write_result("builds", figures)
    print(path, json.dumps(ratios))
    return figures


if __name__ == "__main__":
    main()
