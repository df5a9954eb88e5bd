"""The benchmark figures of bench/README.md and docs/, rendered from bench/results/*.json.

Every figure the documents (:data:`DOCUMENTS`) quote from a benchmark sits in a block
between two marker lines, ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, whose
text is rendered from the committed results (:mod:`bench.figures`), so no figure can drift
from its result. Outside the blocks a figure with a unit (``×``, ``req/s``, ``µs``, ``%``
…) is refused unless its line says it is the source document's. ``make bench`` re-renders
the blocks after the benchmarks; a unit test runs the check.

    python -m bench.tables           # rewrite the blocks from bench/results/*.json
    python -m bench.tables --check   # change nothing; exit 1 if any figure disagrees
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bench.common import RESULTS
from bench.figures import BENCHES, README_ROWS, Result, n, variant
from tests.integration.chaos_report import COMMAND as CHAOS_COMMAND

ROOT = RESULTS.parent.parent
#: where the figures are published; README.md keeps only summaries and links to the docs
DOCUMENTS = (
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    ROOT / "docs" / "performance.md",
    ROOT / "docs" / "guarantees.md",
)

Results = Mapping[str, Result]

_BLOCK = re.compile(
    r"^<!-- bench:(?P<name>[\w-]+) -->\n(?P<body>.*?)^<!-- /bench:(?P=name) -->$",
    re.MULTILINE | re.DOTALL,
)
_MARKER = re.compile(r"^<!-- /?bench:[\w-]+ -->$", re.MULTILINE)
_FIGURE = re.compile(r"\d[\d,.]*\s?(?:×|req/s|requests/s|tok/s|tokens/s|µs|%|MiB|bytes)")
_SOURCE_DOCUMENT = "source document"


def load_results(directory: Path = RESULTS) -> dict[str, Result]:
    """Every ``<name>.json`` of ``directory``, by name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def _absent(name: str, command: str) -> str:
    return f"not measured: `bench/results/{name}.json` is absent (run `{command}`)"


# -- the blocks ---------------------------------------------------------------------------


def machine_block(results: Results) -> str:
    machines = [r["machine"] for r in results.values() if "machine" in r]
    if not machines:
        return "No result in `bench/results/` records the machine it ran on."
    cpus = " or ".join(sorted({str(m["cpus"]) for m in machines}))
    pythons = ", ".join(sorted({m["python"] for m in machines}))
    platforms = ", ".join(sorted({m["platform"] for m in machines}))
    days = sorted({m["when"][:10] for m in machines})
    torch = results.get("engine_cpu", {}).get("torch")
    return (
        f"The results that record their machine were measured on {cpus} CPU cores: Python "
        f"{pythons}"
        + (f", torch {torch}" if torch else "")
        + f", {platforms}; {days[0]}"
        + (f" to {days[-1]}." if len(days) > 1 else ".")
    )


def readme_figures_block(results: Results) -> str:
    lines = ["| what | figure | command |", "|---|---|---|"]
    for what, name, figure in README_ROWS:
        command = f"python -m bench.{name}"
        result = results.get(name)
        cell = figure(result) if result is not None else _absent(name, command)
        lines.append(f"| {what} | {cell} | `{command}` |")
    return "\n".join(lines)


def readme_pipeline_block(results: Results) -> str:
    overhead, wire = results.get("overhead"), results.get("wire")
    if overhead is None or wire is None:
        name = "overhead" if overhead is None else "wire"
        return _absent(name, f"python -m bench.{name}")
    worker = variant(overhead, "worker, defaults")
    share = worker["stage_share_of_loop"]
    request = {row["format"]: row["value_bytes"] for row in wire["requests"]}
    result = {row["format"]: row["value_bytes"] for row in wire["results"]}
    return (
        f"What these mean for a GPU worker: at "
        f"{n(overhead['one_core_requests_per_s']['worker_process'])} requests/s of pipeline "
        "capacity per core, the pipeline is far from the bottleneck of an LLM engine that "
        "answers tens to hundreds of requests per second. A raw consume-produce passthrough "
        "(no decoding, no batching) runs about "
        f"{1 / overhead['ratio_vs_passthrough']['worker, defaults']:.0f}× faster still; the "
        "difference is the per-request work of decoding, validating, tokenizing and encoding "
        f"in Python: decoding takes {share['decode'] * 100:.0f} % of the worker loop and "
        f"encoding results {share['encode'] * 100:.0f} % (`python -m bench.overhead`). On the wire "
        f"(`python -m bench.wire`), a protobuf+zstd request is {request['protobuf+zstd']:.0f} "
        f"bytes against {request['json']:.0f} as a JSON batch line, a result "
        f"{result['protobuf+zstd']:.0f} against {result['json']:.0f}."
    )


def bench_table_block(results: Results) -> str:
    lines = ["| script | question | headline (bench/results) |", "|---|---|---|"]
    for bench in BENCHES:
        result = results.get(bench.result)
        if result is None:
            question, headline = bench.question, _absent(bench.result, bench.command)
        else:
            question, headline = f"{bench.question}: {bench.setup(result)}", bench.headline(result)
        lines.append(f"| `{bench.script}` | {question} | {headline} |")
    return "\n".join(lines)


def bench_durations_block(results: Results) -> str:
    run_all = results.get("run_all")
    if run_all is None:
        return "No `make bench` run is recorded in `bench/results/run_all.json`."
    each = ", ".join(f"{b['name']} {_duration(b['seconds'])}" for b in run_all["benchmarks"])
    return (
        f"The last `make bench` recorded in `bench/results/run_all.json` "
        f"({run_all['machine']['when'][:10]}) took {_duration(run_all['total_seconds'])}: "
        f"{each}."
    )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def guarantees_block(results: Results) -> str:
    """The chaos suite's scenarios (``tests/integration/test_chaos*.py``), one row each."""
    chaos = results.get("chaos")
    if chaos is None:
        return _absent("chaos", CHAOS_COMMAND)
    command = chaos.get("command", CHAOS_COMMAND)
    lines = [
        "| scenario | requests | answered | duplicates in `collect` output "
        "| raw duplicates on the topics | restarts | longest stall | lag 0 after the last answer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in chaos["scenarios"]:
        lines.append(
            f"| {row['scenario']} | {n(row['requests'])} | {n(row['answered'])} "
            f"| {row['collect_duplicates']} | {row['raw_duplicates']} | {row['restarts']} "
            f"| {row['longest_stall_s']:.1f} s | {row['lag_zero_s']:.1f} s |"
        )
    lines += [
        "",
        f"From `bench/results/chaos.json`, written by the chaos suite itself: `{command}`.",
    ]
    return "\n".join(lines)


def overhead_before_after_block(results: Results) -> str:
    """Loop CPU per request and requests/s per variant: ``overhead_before`` (the code
    before issue 25, measured back to back) against ``overhead``."""
    before, after = results.get("overhead_before"), results.get("overhead")
    if before is None or after is None:
        name = "overhead_before" if before is None else "overhead"
        return _absent(name, "python -m bench.overhead")
    lines = [
        "| variant | before: loop µs per request (req/s) | after: loop µs per request (req/s) |",
        "|---|---|---|",
    ]
    measured_before = {v["name"] for v in before["variants"]}
    for row in after["variants"]:
        name = row["name"]
        if "cpu_us_per_request" not in row or name == "passthrough" or name not in measured_before:
            continue
        cells = []
        for result in (before, after):
            figures = variant(result, name)
            cells.append(
                f"{figures['cpu_us_per_request']['loop']:.0f} "
                f"({n(figures['requests_per_s'])} req/s)"
            )
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[Results], str]] = {
    "machine": machine_block,
    "readme-figures": readme_figures_block,
    "readme-pipeline": readme_pipeline_block,
    "bench-table": bench_table_block,
    "bench-durations": bench_durations_block,
    "guarantees": guarantees_block,
    "overhead-before-after": overhead_before_after_block,
}


# -- rendering and checking ---------------------------------------------------------------


def render(text: str, results: Results) -> str:
    """``text`` with the body of every block rendered from ``results``."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(f"unknown bench block {name!r}; known: {', '.join(BLOCKS)}")
        # blank lines around the body: a marker line right under a table would join it
        return f"<!-- bench:{name} -->\n\n{BLOCKS[name](results)}\n\n<!-- /bench:{name} -->"

    return _BLOCK.sub(block, text)


def loose_figures(text: str) -> list[str]:
    """Lines outside the blocks that quote a figure without naming the source document."""
    return [
        line.strip()
        for line in _BLOCK.sub("", text).splitlines()
        if _FIGURE.search(line) and _SOURCE_DOCUMENT not in line
    ]


def problems(documents: Sequence[Path], results: Results) -> list[str]:
    """Everything in ``documents`` that disagrees with ``results``, one message each."""
    found: list[str] = []
    for path in documents:
        text = path.read_text()
        if len(_MARKER.findall(text)) != 2 * len(_BLOCK.findall(text)):
            found.append(f"{path}: a bench marker has no partner")
        rendered = render(text, results)
        if rendered != text:
            diff = difflib.unified_diff(
                text.splitlines(), rendered.splitlines(), "committed", "rendered", lineterm=""
            )
            found.append(f"{path}: figures differ from bench/results:\n" + "\n".join(diff))
        found += [f"{path}: a figure outside a bench block: {line}" for line in loose_figures(text)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any figure disagrees"
    )
    args = parser.parse_args(argv)
    results = load_results()
    if args.check:
        found = problems(DOCUMENTS, results)
        for problem in found:
            print(problem, file=sys.stderr)
        if found:
            print("to render the figures again: python -m bench.tables", file=sys.stderr)
        return 1 if found else 0
    for path in DOCUMENTS:
        text = path.read_text()
        rendered = render(text, results)
        if rendered != text:
            path.write_text(rendered)
            print(f"rendered the figures of {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
