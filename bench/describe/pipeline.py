"""The worker pipeline's benchmarks: batch formation, the echo engine's overhead and
batches, the wire format, the adaptive controller, the API path and latency."""

from __future__ import annotations

from collections.abc import Sequence

from bench.describe.text import Result, n, x


def variant(overhead: Result, name: str) -> Result:
    """One variant of ``overhead.json`` by its name (``"worker, defaults"``, …)."""
    found: Result = next(v for v in overhead["variants"] if v["name"] == name)
    return found


def _formation(r: Result) -> tuple[Result, Result, Result]:
    by_name = {row["name"]: row for row in r["configs"]}
    return by_name["fifo"], by_name["length_aware"], by_name["length_aware+shared_prefix"]


def formation_short(r: Result) -> str:
    fifo, aware, prefix = _formation(r)
    return (
        f"**{x(prefix['throughput_vs_fifo'])}** requests/s (length-aware alone "
        f"{x(aware['throughput_vs_fifo'])}), P99 {x(prefix['p99_vs_fifo'])} of FIFO's, padding "
        f"waste {fifo['padding_waste']:.2f} → {prefix['padding_waste']:.2f} "
        f"({r['requests']} requests)"
    )


def formation_headline(r: Result) -> str:
    fifo, aware, prefix = _formation(r)
    saved = (prefix["prefix_cache"] or {}).get("positions_saved", 0)
    return (
        f"{r['requests']} requests (seed {r['workload']['seed']}); requests/s vs FIFO: "
        f"length-aware {x(aware['throughput_vs_fifo'])}, + shared prefix "
        f"{x(prefix['throughput_vs_fifo'])}; P99 {x(aware['p99_vs_fifo'])} / "
        f"{x(prefix['p99_vs_fifo'])} of FIFO's; padding waste {fifo['padding_waste']:.2f} → "
        f"{aware['padding_waste']:.2f} / {prefix['padding_waste']:.2f}; the prefix cache saved "
        f"{n(saved)} of {n(fifo['prefill_positions'])} prefill positions"
    )


def overhead_short(r: Result) -> str:
    worker = variant(r, "worker, defaults")
    return (
        f"**{n(worker['requests_per_s'])} req/s**; one core sustains "
        f"~{n(r['one_core_requests_per_s']['worker_process'])} req/s "
        f"({worker['cpu_us_per_request']['process']:.0f} µs CPU per request); slowest stage: "
        f"{r['slowest_stage']}"
    )


def overhead_headline(r: Result) -> str:
    worker, passthrough = variant(r, "worker, defaults"), variant(r, "passthrough")
    others = ", ".join(
        f"{v['name'].removeprefix('worker, ')} {n(v['requests_per_s'])}"
        for v in r["variants"]
        if v["name"].startswith("worker, ") and "requests_per_s" in v and v is not worker
    )
    (first, us), *rest = sorted(worker["stage_us_per_request"].items(), key=lambda kv: -kv[1])
    then = ", ".join(f"{name} ({value:.0f})" for name, value in rest)
    return (
        f"worker {n(worker['requests_per_s'])} req/s vs passthrough "
        f"{n(passthrough['requests_per_s'])} ({r['ratio_vs_passthrough']['worker, defaults']}×); "
        f"other settings: {others}; {worker['cpu_us_per_request']['process']:.0f} µs CPU per "
        f"request → one core ~{n(r['one_core_requests_per_s']['worker_process'])} req/s; "
        f"slowest stage: {first} ({us:.0f} µs), then {then}{_overhead_loop(r, worker)}"
    )


def _overhead_loop(r: Result, worker: Result) -> str:
    """Loop-thread and broker CPU per request against the defaults (issue 32's goals), for
    the variants that have them."""
    names = {v["name"] for v in r["variants"]}
    if not {"worker, 64 partitions", "worker, realistic prompts"} <= names:
        return ""
    wide, realistic = variant(r, "worker, 64 partitions"), variant(r, "worker, realistic prompts")
    cpu, wide_cpu = worker["cpu_us_per_request"], wide["cpu_us_per_request"]
    realistic_loop = realistic["cpu_us_per_request"]["loop"]
    wide_ratio = wide["requests_per_s"] / worker["requests_per_s"]
    return (
        f"; loop-thread CPU per request {cpu['loop']:.0f} µs, with realistic prompts "
        f"({r['realistic_request_value_bytes']:.0f} B) {realistic_loop:.0f} µs; "
        f"64 partitions {x(wide_ratio)} the defaults' requests/s, broker CPU "
        f"{wide_cpu['broker']:.0f} µs per request vs {cpu['broker']:.0f}"
    )


def batcher_echo_short(r: Result) -> str:
    fixed = r["runs"][0]
    low, high = fixed["rss_mib_min_max"]
    return (
        f"{n(r['requests'])}-request backlog: mean batch {fixed['mean_batch_size']:.1f} of "
        f"{r['max_batch_size']}, fill "
        f"{fixed['mean_batch_fill']:.2f}, peak in flight {fixed['peak_in_flight']} of "
        f"{r['prefetch_count']}, RSS {low:.0f}–{high:.0f} MiB"
    )


def batcher_echo_headline(r: Result) -> str:
    return "; ".join(
        f"adaptive {'on' if run['adaptive'] else 'off'}: mean batch {run['mean_batch_size']} of "
        f"{r['max_batch_size']}, fill {run['mean_batch_fill']}, peak in flight "
        f"{run['peak_in_flight']}, {run['requests_per_s']} req/s, RSS "
        f"{run['rss_mib_min_max'][0]}–{run['rss_mib_min_max'][1]} MiB"
        for run in r["runs"]
    )


def wire_headline(r: Result) -> str:
    def sizes(rows: Sequence[Result]) -> str:
        return " vs ".join(f"{row['value_bytes']:.0f} B {row['format']}" for row in rows)

    decode = " vs ".join(f"{row['decode_us']:.1f} µs {row['format']}" for row in r["requests"])
    return f"request {sizes(r['requests'])}; result {sizes(r['results'])}; decode {decode}"


def adaptive_headline(r: Result) -> str:
    patterns = dict.fromkeys(run["pattern"] for run in r["runs"])
    return "; ".join(
        f"{pattern}: "
        + ", ".join(
            f"{run['config']} {run['requests_per_s']} req/s P99 {run['p99_ms'] / 1000:.2f} s"
            for run in r["runs"]
            if run["pattern"] == pattern
        )
        for pattern in patterns
    )


def api_short(r: Result) -> str:
    return (
        f"{n(r['lines'])} lines ({r['file_bytes'] / 2**20:.0f} MiB): API {r['api_s']} s vs "
        f"CLI {r['cli_s']} s ({x(r['api_over_cli'])}); server RSS +"
        f"{r['server_rss_growth_over_file']:.2f}× the file during upload"
    )


def api_headline(r: Result) -> str:
    return (
        f"{api_short(r)}; upload {r['api_upload_s']} s, publish {r['api_publish_s']} s; "
        f"server RSS {r['server_rss_before_mib']:.0f} → {r['server_rss_peak_mib']:.0f} MiB"
    )


def latency_short(r: Result) -> str:
    loads = [load for run in r["runs"] for load in run["loads"]]
    met = sum(load["meets_goals"] for load in loads)
    worst_wait = max(load["batch_wait"]["p99_ms"] for load in loads)
    worst_e2e = max(load["end_to_end"]["p99_ms"] for load in loads)
    return (
        f"goals met in **{met} of {len(loads)}** runs; worst P99 batch wait "
        f"{worst_wait:.0f} ms, end to end {worst_e2e:.0f} ms (timeout_ms "
        f"{r['setup']['timeout_ms']}, commit every {r['setup']['commit_interval_ms']} ms)"
    )


def latency_headline(r: Result) -> str:
    rows = []
    for run in r["runs"]:
        for load in run["loads"]:
            rows.append(
                f"{run['engine']}, {run['partitions']} partitions, {load['load']} × "
                f"{n(run['capacity_requests_per_s'])} req/s: P99 batch wait "
                f"{load['batch_wait']['p99_ms']:.0f} ms (goal "
                f"{load['goal_batch_wait_p99_ms']:.0f}), end to end "
                f"{load['end_to_end']['p99_ms']:.0f} ms (goal {load['goal_end_to_end_p99_ms']:.0f})"
            )
    return "; ".join(rows)
