"""One PNG chart per benchmark result: ``bench/results/<name>.json`` → ``<name>.png``.

Needs matplotlib (the ``bench`` extra). Results without a chart of their own here are
skipped; a missing result is simply not drawn.

    .venv/bin/python -m bench.plot
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

from bench.common import RESULTS

Result = dict[str, Any]


def _bars(ax: Axes, labels: list[str], values: list[float], title: str, unit: str) -> None:
    bars = ax.barh(labels, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:,.4g}" for v in values], padding=3, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(unit)
    ax.invert_yaxis()
    ax.margins(x=0.2)


def overhead(result: Result, axes: list[Axes]) -> None:
    rows = [r for r in result["variants"] if "requests_per_s" in r]
    _bars(
        axes[0],
        [r["name"] for r in rows],
        [r["requests_per_s"] for r in rows],
        f"{result['requests']:,} requests, embedded broker (log scale)",
        "requests/s",
    )
    axes[0].set_xscale("log")
    workers = [r for r in rows if "stage_us_per_request" in r]
    parts = ("decode", "batch", "encode", "produce")
    left = [0.0] * len(workers)
    for part in (*parts, "rest_of_loop", "librdkafka", "other_threads"):
        if part in parts:
            widths = [r["stage_us_per_request"][part] for r in workers]
        elif part == "rest_of_loop":
            widths = [
                r["cpu_us_per_request"]["loop"] - sum(r["stage_us_per_request"].values())
                for r in workers
            ]
        else:
            widths = [r["cpu_us_per_request"][part] for r in workers]
        axes[1].barh([r["name"] for r in workers], widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes[1].set_title("worker CPU per request, by stage and thread", fontsize=10)
    axes[1].set_xlabel("CPU µs per request")
    axes[1].invert_yaxis()
    axes[1].legend(fontsize=7, loc="lower right")


def realtime(result: Result, axes: list[Axes]) -> None:
    modes = result["modes"]
    labels = [f"({k}) {m['name']}" for k, m in modes.items()]
    n, tokens = result["requests"], result["max_tokens"]
    _bars(
        axes[0],
        labels,
        [m["requests_per_s"] for m in modes.values()],
        f"{n} summaries × {tokens} tokens, {result['model']} on CPU: "
        f"b/a {result['throughput_ratio_b_over_a']}x, b/c {result['throughput_ratio_b_over_c']}x",
        "requests/s",
    )
    width = 0.2
    for i, (key, label) in enumerate(
        [("e2e_p50_ms", "end-to-end P50"), ("e2e_p99_ms", "end-to-end P99"),
         ("service_p50_ms", "service P50"), ("service_p99_ms", "service P99")]
    ):  # fmt: skip
        xs = [j + (i - 1.5) * width for j in range(len(modes))]
        axes[1].bar(xs, [m[key] / 1000 for m in modes.values()], width, label=label)
    axes[1].set_xticks(range(len(modes)), [f"({k})" for k in modes])
    axes[1].set_ylabel("seconds")
    axes[1].set_title("latency", fontsize=10)
    axes[1].legend(fontsize=7)


def wire(result: Result, axes: list[Axes]) -> None:
    for ax, kind in zip(axes, ("requests", "results"), strict=True):
        rows = result[kind]
        width = 0.27
        for i, key in enumerate(("value_bytes", "encode_us", "decode_us")):
            xs = [j + (i - 1) * width for j in range(len(rows))]
            bars = ax.bar(xs, [r[key] for r in rows], width, label=key.replace("_", " "))
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(rows)), [r["format"] for r in rows])
        ax.set_yscale("log")
        ax.set_title(f"{kind}: bytes on the wire, CPU µs per message", fontsize=10)
        ax.legend(fontsize=7)


def adaptive(result: Result, axes: list[Axes]) -> None:
    for ax, pattern in zip(axes, ("steady", "bursty"), strict=True):
        rows = [r for r in result["runs"] if r["pattern"] == pattern]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["requests_per_s"] for r in rows], 0.4, label="req/s")
        twin = ax.twinx()
        twin.bar([x + 0.2 for x in xs], [r["p99_ms"] for r in rows], 0.4, color="tab:red")
        twin.set_yscale("log")
        twin.set_ylabel("P99 latency, ms (red)")
        ax.set_xticks(list(xs), [r["config"] for r in rows], fontsize=8)
        ax.set_ylabel("requests/s (blue)")
        ax.set_title(f"{pattern}, {result['arrival_rate_per_s']} requests/s offered", fontsize=10)


def batcher_echo(result: Result, axes: list[Axes]) -> None:
    runs = result.get("runs", [result])
    labels = [f"adaptive {r['adaptive']}" if "adaptive" in r else "run" for r in runs]
    fractions = {
        "mean batch size / max_batch_size": [
            r["mean_batch_size"] / result["max_batch_size"] for r in runs
        ],
        "mean batch fill (tokens)": [r["mean_batch_fill"] for r in runs],
        "peak in flight / prefetch_count": [
            r["peak_in_flight"] / result["prefetch_count"] for r in runs
        ],
    }
    width = 0.8 / len(fractions)
    for i, (name, values) in enumerate(fractions.items()):
        xs = [j + (i - (len(fractions) - 1) / 2) * width for j in range(len(runs))]
        axes[0].bar(xs, values, width, label=name)
    axes[0].set_xticks(range(len(runs)), labels)
    axes[0].set_title(
        f"{result['requests']:,} requests, {result.get('engine', 'echo')}", fontsize=10
    )
    axes[0].legend(fontsize=7)
    if all("requests_per_s" in r for r in runs):
        _bars(axes[1], labels, [r["requests_per_s"] for r in runs], "throughput", "requests/s")


def engine_cpu(result: Result, axes: list[Axes]) -> None:
    rows = result["results"]
    sizes = [str(r["batch_size"]) for r in rows]
    axes[0].bar(sizes, [r["tokens_per_s"] for r in rows])
    axes[0].set_xlabel("static batch size")
    axes[0].set_ylabel("generated tokens/s")
    axes[0].set_title(f"{result['model']} on {result['cpus']} CPU cores", fontsize=10)
    axes[1].bar(sizes, [r["ratio_vs_batch_1"] for r in rows], color="tab:green")
    axes[1].set_xlabel("static batch size")
    axes[1].set_ylabel("throughput vs batch 1")


def api(result: Result, axes: list[Axes]) -> None:
    _bars(
        axes[0],
        ["batchpipe submit (CLI)", "API: upload", "API: upload + create + publish"],
        [result["cli_s"], result["api_upload_s"], result["api_s"]],
        f"{result['lines']:,} lines: time to the requests topic",
        "seconds",
    )
    _bars(
        axes[1],
        ["file", "server RSS growth during upload"],
        [
            result["file_bytes"] / 2**20,
            result["server_rss_peak_mib"] - result["server_rss_before_mib"],
        ],
        "memory of the API server",
        "MiB",
    )


def structured(result: Result, axes: list[Axes]) -> None:
    conditions = result["conditions"]
    names = ["constrained", "unconstrained"]
    axes[0].bar(names, [conditions[c]["tokens_per_s"] for c in names])
    axes[0].set_ylabel("generated tokens/s")
    axes[0].set_title(f"{result['model']}, {result['requests']} requests", fontsize=10)
    axes[1].bar(["parse + validate"], [result["valid_pct"]], color="tab:green")
    axes[1].set_ylim(0, 100)
    axes[1].set_ylabel("% of constrained outputs")


def inflight(result: Result, axes: list[Axes]) -> None:
    engines = result["engines"]
    labels = [f"{name} {mode}" for name, e in engines.items() for mode in e["modes"]]
    runs = [m for e in engines.values() for m in e["modes"].values()]
    ratios = ", ".join(
        f"{name} {e['ratio_tokens_per_s']}x (FIFO {e['ratio_tokens_per_s_fifo']}x)"
        for name, e in engines.items()
    )
    _bars(
        axes[0],
        labels,
        [m["tokens_per_s"] for m in runs],
        f"generated tokens/s, in flight / static: {ratios}",
        "tokens/s",
    )
    width = 0.27
    keys = [("e2e_p50_s", "end-to-end P50"), ("e2e_p99_s", "end-to-end P99")]
    for i, (key, label) in enumerate(keys):
        xs = [j + (i - 0.5) * width for j in range(len(runs))]
        axes[1].bar(xs, [m[key] for m in runs], width, label=label)
    twin = axes[1].twinx()
    twin.plot(range(len(runs)), [m["slot_idle_fraction"] for m in runs], "o", color="tab:red")
    twin.set_ylim(0, 1)
    twin.set_ylabel("sequence slots idle (red)")
    axes[1].set_xticks(range(len(runs)), labels, fontsize=8)
    axes[1].set_ylabel("seconds")
    axes[1].set_title("latency (all requests at t=0) and idle slots", fontsize=10)
    axes[1].legend(fontsize=7, loc="upper left")


def vllm_direct(result: Result, axes: list[Axes]) -> None:
    runs = result["runs"]
    for i, mode in enumerate(("waves", "in_flight")):
        xs = [j + (i - 0.5) * 0.4 for j in range(len(runs))]
        axes[0].bar(xs, [r["modes"][mode]["tokens_per_s"] for r in runs], 0.4, label=mode)
    axes[0].set_xticks(range(len(runs)), [r["dtype"] for r in runs])
    axes[0].set_ylabel("generated tokens/s")
    axes[0].set_title(
        f"vLLM fed directly: {result['requests']} requests, {result['wave_size']} at a time",
        fontsize=10,
    )
    axes[0].legend(fontsize=7)
    _bars(
        axes[1],
        [r["dtype"] for r in runs],
        [r["in_flight_vs_waves"] for r in runs],
        "in flight vs static waves",
        "ratio",
    )


def embeddings(result: Result, axes: list[Axes]) -> None:
    engines = result["engines"]
    modes = ("one_at_a_time", "batched_direct", "batchpipe")
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [j + (i - 1) * width for j in range(len(engines))]
        rates = [e["modes"][mode]["embeddings_per_s"] for e in engines.values()]
        axes[0].bar(xs, rates, width, label=mode.replace("_", " "))
    axes[0].set_xticks(range(len(engines)), list(engines))
    axes[0].set_ylabel("embeddings/s")
    axes[0].set_title(f"{result['model']}, {result['requests']} texts", fontsize=10)
    axes[0].legend(fontsize=7)
    _bars(
        axes[1],
        [f"{kind} {what}" for kind in engines for what in ("direct", "batchpipe")],
        [e[key] for e in engines.values() for key in ("batched_direct_vs_one", "batchpipe_vs_one")],
        "batched vs one at a time",
        "ratio",
    )


def broker_earliest(result: Result, axes: list[Axes]) -> None:
    _bars(
        axes[0],
        ["earliest offset above 0"],
        [result["wrong_earliest"]],
        f"of {result['trials']} topics, {result['producers']} producers each",
        "topics",
    )
    _bars(
        axes[1],
        ["from OFFSET_BEGINNING", "from offset 0"],
        [result["lost_from_beginning"], result["lost_from_start"]],
        f"records a reader missed, of {result['records']:,}",
        "records",
    )


def latency(result: Result, axes: list[Axes]) -> None:
    rows = [(r, load) for r in result["runs"] for load in r["loads"]]
    labels = [f"{r['engine'][5:]} {r['partitions']}p x{load['load']}" for r, load in rows]
    _bars(
        axes[0],
        labels,
        [load["end_to_end"]["p99_ms"] for _, load in rows],
        "end-to-end P99 (goal: see bench/README.md)",
        "ms",
    )
    _bars(
        axes[1],
        labels,
        [load["batch_wait"]["p99_ms"] for _, load in rows],
        f"batch wait P99 (goal {result['setup']['timeout_ms'] + 20} ms)",
        "ms",
    )


def fairness(result: Result, axes: list[Axes]) -> None:
    paces = result["paces"]
    step = {"0.02": "20 ms", "1": "1 s"}
    modes = [(t, mode) for t in paces for mode in ("fifo", "fair")]
    _bars(
        axes[0],
        [*(f"{mode.replace('fifo', 'FIFO')} {step[t]}" for t, mode in modes), "after a cancel"],
        [
            *(paces[t][f"{mode}_small_slowdown_median"] for t, mode in modes),
            result["cancel"]["small_with_vs_without"],
        ],
        "small batches: median slowdown (after a cancel: ÷ without it)",
        "time ÷ time alone",
    )
    three = result["three_workers"]
    _bars(
        axes[1],
        [
            *(f"alone {step[t]}" for t in paces),
            *(f"four {step[t]}" for t in paces),
            "3 workers",
            "mixed lengths",
        ],
        [
            *(paces[t]["single_batch_throughput_fair_vs_fifo"] for t in paces),
            *(paces[t]["concurrent_throughput_fair_vs_fifo"] for t in paces),
            three["throughput_fair_vs_fifo"],
            result["mixed_lengths"]["throughput_fair_vs_fifo"],
        ],
        "fair share's requests/s ÷ FIFO's",
        "ratio",
    )


def remote(result: Result, axes: list[Axes]) -> None:
    t, c = result["throughput"], result["coexist"]
    direct = t["direct_requests_per_s"]
    _bars(
        axes[0],
        [*(f"direct, {k} in flight" for k in direct), "through batchpipe"],
        [*direct.values(), t["batchpipe_requests_per_s"]],
        "one batch against the stand-in server",
        "requests/s",
    )
    _bars(
        axes[1],
        ["alone", "+ batch, AIMD", "+ batch, fixed window"],
        [c[name]["interactive_p99_ms"] for name in ("alone", "aimd", "fixed")],
        "interactive P99 in bursts",
        "ms",
    )


CHARTS: dict[str, Callable[[Result, list[Axes]], None]] = {
    "overhead": overhead,
    "realtime": realtime,
    "wire": wire,
    "adaptive": adaptive,
    "batcher_echo": batcher_echo,
    "engine_cpu": engine_cpu,
    "api": api,
    "inflight": inflight,
    "vllm_direct": vllm_direct,
    "structured": structured,
    "embeddings": embeddings,
    "broker_earliest": broker_earliest,
    "latency": latency,
    "fairness": fairness,
    "remote": remote,
}


# benchmarks that draw their own chart
OWN_CHARTS = ("formation",)


def main(results: Path = RESULTS) -> list[Path]:
    """Draw every chart whose result exists; returns the PNG files written."""
    written = []
    for name, draw in CHARTS.items():
        source = results / f"{name}.json"
        if not source.exists():
            continue
        figure = Figure(figsize=(14, 4.5))
        draw(json.loads(source.read_text()), list(figure.subplots(1, 2)))
        figure.suptitle(f"bench.{name}", fontsize=12)
        figure.tight_layout()
        path = results / f"{name}.png"
        figure.savefig(path, dpi=110)
        written.append(path)
    return written


if __name__ == "__main__":
    for written in main():
        print(written)
