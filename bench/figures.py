"""What each benchmark result says, in words: the sentences :mod:`bench.tables` publishes.

Each function takes one parsed ``bench/results/<name>.json`` and returns text made only
of the figures recorded there; nothing here is typed by hand. :data:`BENCHES` describes
every benchmark for bench/README.md, :data:`README_ROWS` the short figures of README.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Result = dict[str, Any]
Describe = Callable[[Result], str]


def x(ratio: float) -> str:
    return f"{ratio:.2f}×"


def n(value: float) -> str:
    return f"{value:,.0f}"


def variant(overhead: Result, name: str) -> Result:
    """One variant of ``overhead.json`` by its name (``"worker, defaults"``, …)."""
    found: Result = next(v for v in overhead["variants"] if v["name"] == name)
    return found


def _formation(r: Result) -> tuple[Result, Result, Result]:
    by_name = {row["name"]: row for row in r["configs"]}
    return by_name["fifo"], by_name["length_aware"], by_name["length_aware+shared_prefix"]


# -- short figures: one cell of README.md's table each ------------------------------------


def realtime_short(r: Result) -> str:
    return (
        f"**{x(r['throughput_ratio_b_over_a'])}** requests/s ({r.get('engine', 'hf')} engine, "
        f"{r['requests']} requests, "
        f"{r['max_tokens']} tokens each; the source document measured "
        f"{r['source_document_b_over_a']}×)"
    )


def ideal_short(r: Result) -> str:
    ratio = r["throughput_ratio_b_over_c"]
    reaches = "at" if ratio >= 0.95 else "below"  # within 5 %: the noise of a shared machine
    return f"**{x(ratio)}**: the pipeline runs {reaches} the engine's own limit"


def default_engine_short(r: Result) -> str:
    if "engines" not in r:
        return "not measured: rerun `python -m bench.realtime` (hf and vllm side by side)"
    others = ", ".join(f"{x(ratio)} {kind}'s" for kind, ratio in r["default_over_other_b"].items())
    return (
        f"**{r['default_engine']}**: {others} requests/s through the worker "
        f"({r['requests']} requests of {r['max_tokens']} tokens, same run)"
    )


def engine_cpu_short(r: Result) -> str:
    top, *others = reversed(r["results"][1:])
    more = ", ".join(f"{x(row['ratio_vs_batch_1'])} at {row['batch_size']}" for row in others)
    identical = sorted({row["greedy_identical_to_alone"] for row in r["results"][1:]})
    return (
        f"**{x(top['ratio_vs_batch_1'])}** tokens/s at batch {top['batch_size']} ({more}); "
        f"greedy output identical alone and batched: {', '.join(identical)}"
    )


def vllm_direct_short(r: Result) -> str:
    first, *others = r["runs"]

    def rates(run: Result) -> str:
        modes = run["modes"]
        return (
            f"{modes['in_flight']['tokens_per_s']} vs {modes['waves']['tokens_per_s']} tok/s, "
            f"{run['dtype']}"
        )

    def in_flight(run: Result) -> float:
        rate: float = run["modes"]["in_flight"]["tokens_per_s"]
        return rate

    # each further dtype: its own in-flight/waves ratio, and its in-flight rate against the
    # first dtype's (float32, the CPU default)
    more = "".join(
        f"; {x(run['in_flight_vs_waves'])} in {run['dtype']} ({rates(run)}), whose in-flight "
        f"rate is {x(in_flight(run) / in_flight(first))} {first['dtype']}'s"
        for run in others
    )
    return (
        f"**{x(first['in_flight_vs_waves'])}** tokens/s kept in flight vs static waves of "
        f"{r['wave_size']} ({rates(first)}){more}"
    )


def formation_short(r: Result) -> str:
    fifo, aware, prefix = _formation(r)
    return (
        f"**{x(prefix['throughput_vs_fifo'])}** requests/s (length-aware alone "
        f"{x(aware['throughput_vs_fifo'])}), P99 {x(prefix['p99_vs_fifo'])} of FIFO's, padding "
        f"waste {fifo['padding_waste']:.2f} → {prefix['padding_waste']:.2f} "
        f"({r['requests']} requests)"
    )


def overhead_short(r: Result) -> str:
    worker = variant(r, "worker, defaults")
    return (
        f"**{n(worker['requests_per_s'])} req/s**; one core sustains "
        f"~{n(r['one_core_requests_per_s']['worker_process'])} req/s "
        f"({worker['cpu_us_per_request']['process']:.0f} µs CPU per request); slowest stage: "
        f"{r['slowest_stage']}"
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


def _static_feed(e: Result) -> str:
    """What an engine's static arm is, in a few words."""
    return "padded static batches" if "step_model" in e else "one batch at a time"


def inflight_short(r: Result) -> str:
    parts = [
        f"{name} vs {_static_feed(e)}: **{x(e['ratio_tokens_per_s'])}** generated tokens/s "
        f"with length-aware formation, {x(e['ratio_tokens_per_s_fifo'])} with FIFO "
        f"({e['requests']} requests, batch {e['max_batch_size']}, max_tokens "
        f"{e['max_tokens'][0]}–{e['max_tokens'][1]})"
        for name, e in r["engines"].items()
    ]
    rss = r.get("rss")
    if rss:
        _, _, low, high = rss["rss_mib_first_last_min_max"]
        parts.append(
            f"RSS {low:.0f}–{high:.0f} MiB while a {n(rss['requests'])}-request backlog drains"
        )
    return "; ".join(parts)


#: (what is compared, result name, its figure) — README.md's table, in order
def structured_short(r: Result) -> str:
    return (
        f"**{r['valid_pct']:g} %** of {r['requests']} outputs over {r['schemas']} schemas parse "
        f"and validate; tokens/s {x(r['tokens_per_s_ratio'])} of unconstrained"
    )


def structured_headline(r: Result) -> str:
    c, u = r["conditions"]["constrained"], r["conditions"]["unconstrained"]
    return (
        f"{r['valid_pct']:g} % parse and validate (unconstrained: "
        f"{r['unconstrained_valid_pct']:g} %); {c['tokens_per_s']} vs {u['tokens_per_s']} "
        f"generated tokens/s ({x(r['tokens_per_s_ratio'])}), {c['requests_per_s']} vs "
        f"{u['requests_per_s']} requests/s"
    )


def embeddings_short(r: Result) -> str:
    e = r["engines"]["vllm"]
    return (
        f"vLLM pooling: **{x(e['batchpipe_vs_one'])}** embeddings/s through the worker vs one "
        f"at a time ({x(e['batched_direct_vs_one'])} fed directly)"
    )


def embeddings_headline(r: Result) -> str:
    parts = []
    for kind, e in r["engines"].items():
        m = e["modes"]
        parts.append(
            f"{kind}: one at a time {m['one_at_a_time']['embeddings_per_s']}, batched "
            f"{m['batched_direct']['embeddings_per_s']} ({x(e['batched_direct_vs_one'])}), "
            f"batchpipe {m['batchpipe']['embeddings_per_s']} ({x(e['batchpipe_vs_one'])}) "
            "embeddings/s"
        )
    return "; ".join(parts)


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


def _pace(r: Result, token_s: str) -> str:
    p = r["paces"][token_s]
    step = "20 ms" if token_s == "0.02" else f"{float(token_s):g} s"
    return (
        f"at {step} a step, 10-request batches behind {n(p['large'])}: median slowdown "
        f"**{x(p['fair_small_slowdown_median'])}** fair vs {x(p['fifo_small_slowdown_median'])} "
        f"FIFO; one batch alone **{x(p['single_batch_throughput_fair_vs_fifo'])}** FIFO's "
        f"requests/s, four together **{x(p['concurrent_throughput_fair_vs_fifo'])}**"
    )


def fairness_short(r: Result) -> str:
    three, mixed = r["three_workers"], r["mixed_lengths"]
    return (
        f"{_pace(r, '0.02')}; {_pace(r, '1')}; three workers at 1 s a step "
        f"**{x(three['throughput_fair_vs_fifo'])}** FIFO's requests/s; mixed lengths "
        f"({mixed['long_share']:.0%} of requests {mixed['tokens']['long']} tokens, the rest "
        f"{mixed['tokens']['short']}, in flight) **{x(mixed['throughput_fair_vs_fifo'])}** "
        f"FIFO's requests/s; a 10-request batch after a {n(r['cancel']['doomed'])}-request "
        f"batch was cancelled **{x(r['cancel']['small_with_vs_without'])}** its time without "
        f"the cancel; the feeder alone moves **{n(r['mover']['64']['requests_per_s'])} "
        "req/s** with 64 active batches"
    )


def fairness_headline(r: Result) -> str:
    def worst(token_s: str) -> str:
        p = r["paces"][token_s]
        return (
            f"worst small-batch slowdown {x(p['fair_small_slowdown_max'])} fair vs "
            f"{x(p['fifo_small_slowdown_max'])} FIFO, Jain's index of four batches "
            f"{p['fair_jain']:.2f} fair, {p['fifo_jain']:.2f} FIFO, a small batch alone "
            f"{x(p['small_alone_fair_vs_fifo'])} its FIFO time"
        )

    mover = r["mover"]
    return (
        f"{fairness_short(r)}. At 20 ms: {worst('0.02')}; at 1 s: {worst('1')}; the mover "
        f"alone: one batch {n(mover['1']['requests_per_s'])} req/s, four "
        f"{n(mover['4']['requests_per_s'])} req/s"
    )


def remote_short(r: Result) -> str:
    t, c = r["throughput"], r["coexist"]
    return (
        f"**{x(t['batchpipe_vs_best_direct'])}** the best fixed-concurrency client's "
        f"requests/s; interactive P99 with batch work on top {x(c['aimd']['p99_vs_alone'])} "
        f"of alone with AIMD, {x(c['fixed']['p99_vs_alone'])} with a fixed window"
    )


def remote_headline(r: Result) -> str:
    t, c = r["throughput"], r["coexist"]
    direct = ", ".join(f"{k}: {v}" for k, v in t["direct_requests_per_s"].items())
    rows = "; ".join(
        f"{name}: interactive P50/P99 {c[name]['interactive_p50_ms']:.0f}/"
        f"{c[name]['interactive_p99_ms']:.0f} ms ({x(c[name]['p99_vs_alone'])} of alone), "
        f"batch {c[name]['batch_per_s']['idle']} answers/s idle, "
        f"{c[name]['batch_per_s']['burst']} in bursts"
        for name in ("aimd", "fixed")
    )
    return (
        f"direct client req/s by concurrency {direct}; batchpipe {t['batchpipe_requests_per_s']} "
        f"req/s ({x(t['batchpipe_vs_best_direct'])} the best); alone: interactive P50/P99 "
        f"{c['alone']['interactive_p50_ms']:.0f}/{c['alone']['interactive_p99_ms']:.0f} ms; {rows}"
    )


README_ROWS: tuple[tuple[str, str, Describe], ...] = (
    ("batching vs one request at a time, SmolLM2 on CPU", "realtime", realtime_short),
    ("batchpipe vs the same engine fed directly, no Kafka", "realtime", ideal_short),
    ("the default CPU engine, hf vs vllm through the worker", "realtime", default_engine_short),
    ("static batches vs batch 1, hf engine, SmolLM2 on CPU", "engine_cpu", engine_cpu_short),
    ("vLLM in flight vs static waves, SmolLM2 on CPU, no Kafka", "vllm_direct", vllm_direct_short),
    ("length-aware + shared-prefix formation vs FIFO, mixed prompts", "formation", formation_short),
    ("worker pipeline with the echo engine, default settings", "overhead", overhead_short),
    ("batch formation on a backlog, echo engine", "batcher_echo", batcher_echo_short),
    ("OpenAI API upload + create vs `batchpipe submit`, same file", "api", api_short),
    ("in flight vs static batches, through the worker", "inflight", inflight_short),
    ("structured outputs (xgrammar), SmolLM2 on CPU", "structured", structured_short),
    (
        "embeddings batched vs one at a time, all-MiniLM-L6-v2 on CPU",
        "embeddings",
        embeddings_short,
    ),
    ("latency at half and a tenth of capacity, echo engine", "latency", latency_short),
    ("fair share: small batches behind a large one", "fairness", fairness_short),
    ("remote engine (engine.kind openai) in front of a paced server", "remote", remote_short),
)


# -- headlines: bench/README.md, one row per benchmark -----------------------------------


def batcher_echo_headline(r: Result) -> str:
    return "; ".join(
        f"adaptive {'on' if run['adaptive'] else 'off'}: mean batch {run['mean_batch_size']} of "
        f"{r['max_batch_size']}, fill {run['mean_batch_fill']}, peak in flight "
        f"{run['peak_in_flight']}, {run['requests_per_s']} req/s, RSS "
        f"{run['rss_mib_min_max'][0]}–{run['rss_mib_min_max'][1]} MiB"
        for run in r["runs"]
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


def engine_cpu_headline(r: Result) -> str:
    rates = " / ".join(str(row["tokens_per_s"]) for row in r["results"])
    return f"{rates} tok/s; {engine_cpu_short(r).replace('**', '')}"


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


def wire_headline(r: Result) -> str:
    def sizes(rows: Sequence[Result]) -> str:
        return " vs ".join(f"{row['value_bytes']:.0f} B {row['format']}" for row in rows)

    decode = " vs ".join(f"{row['decode_us']:.1f} µs {row['format']}" for row in r["requests"])
    return f"request {sizes(r['requests'])}; result {sizes(r['results'])}; decode {decode}"


def realtime_headline(r: Result) -> str:
    def one(e: Result) -> str:
        rates = "; ".join(f"({k}) {m['requests_per_s']} req/s" for k, m in e["modes"].items())
        return (
            f"{e.get('engine', 'hf')}: b/a = {x(e['throughput_ratio_b_over_a'])} requests/s, "
            f"b/c = {x(e['throughput_ratio_b_over_c'])}; {rates}"
        )

    engines = r.get("engines", {"hf": r}).values()
    return (
        "; ".join(one(e) for e in engines)
        + f" (the source document's b/a: {r['source_document_b_over_a']}×); N = {r['requests']}"
        + (f"; default engine: {r['default_engine']}" if "default_engine" in r else "")
    )


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


def gpu_headline(r: Result) -> str:
    hf = r["hf"]
    parts = []
    if "runs" in hf:
        for pinned in (True, False):
            runs = [run for run in hf["runs"] if run["pinned"] is pinned]
            if runs:
                rates = " / ".join(str(run["tokens_per_s"]) for run in runs)
                sizes = "/".join(str(run["batch_size"]) for run in runs)
                parts.append(f"hf {'pinned' if pinned else 'pageable'} {rates} tok/s at {sizes}")
        staging = hf["staging_64x2048_ms"]
        pinned, pageable = staging["pinned"], staging["pageable"]
        parts.append(f"staging 64 × 2048 ids {pinned:.2f} ms pinned, {pageable:.2f} ms pageable")
    pipeline = r.get("pipeline", {})
    if "runs" in pipeline:
        fed = "; ".join(
            f"{run['name']}: {n(run['requests_per_s'])} req/s, engine busy "
            f"{run['engine_busy']:.0%}, mean batch {run['mean_batch_size']}"
            for run in pipeline["runs"]
        )
        parts.append(
            f"the whole worker feeding hf ({pipeline['new_tokens']} new tokens per request): {fed}"
        )
    elif pipeline:
        parts.append(f"pipeline: {pipeline.get('skipped') or pipeline.get('error', 'not run')}")
    for name in ("hf", "trtllm", "vllm"):
        section = r.get(name, {})
        if "tokens_per_s" in section:
            parts.append(f"{name} in flight {section['tokens_per_s']} tok/s at {section['batch']}")
        elif "runs" not in section:
            parts.append(f"{name}: {section.get('skipped') or section.get('error', 'not run')}")
    return f"{r['gpu']}: {'; '.join(parts)}"


def inflight_headline(r: Result) -> str:
    parts = []
    for name, e in r["engines"].items():
        modes = ", ".join(
            f"{mode} {m['requests_per_s']} req/s, {n(m['tokens_per_s'])} tok/s, P50/P99 "
            f"{m['e2e_p50_s']}/{m['e2e_p99_s']} s, slots idle {m['slot_idle_fraction']:.0%}"
            for mode, m in e["modes"].items()
        )
        bound = e.get("in_flight_bound")
        best = (
            f"; in flight at best {n(bound['tokens_per_s'])} tok/s, slots idle "
            f"{bound['slot_idle_fraction']:.0%} (the step model with an instant feeder: the "
            "drain at the end)"
            if bound
            else ""
        )
        parts.append(
            f"{name}: in flight / static = {x(e['ratio_requests_per_s'])} requests/s, "
            f"{x(e['ratio_tokens_per_s'])} tokens/s ({x(e['ratio_tokens_per_s_fifo'])} with FIFO "
            f"formation; {modes}{best})"
        )
    rss = r.get("rss")
    if rss:
        first, last, low, high = rss["rss_mib_first_last_min_max"]
        parts.append(
            f"RSS under a {n(rss['requests'])}-request backlog (echo in flight, prefetch "
            f"{rss['prefetch_count']}): {first:.0f} MiB at the first answer, {last:.0f} at the "
            f"last, {low:.0f}–{high:.0f} between; at most {rss['peak_inflight_requests_seen']} "
            "requests held"
        )
    return "; ".join(parts)


def inflight_setup(r: Result) -> str:
    parts = []
    for name, e in r["engines"].items():
        shape = (
            f"each step {e['step_model']['a_s'] * 1000:g} ms + "
            f"{e['step_model']['b_s_per_sequence'] * 1e6:g} µs per running sequence"
            if "step_model" in e
            else f"model {e['model']}, prompts {e['prompt_words'][0]}–{e['prompt_words'][1]} words"
        )
        parts.append(
            f"{name} ({shape}; static: {e.get('static_feed', 'one batch at a time')}), "
            f"{e['requests']} requests, batch {e['max_batch_size']}, "
            f"max_tokens {e['max_tokens'][0]}–{e['max_tokens'][1]}"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class Bench:
    """One row of bench/README.md's table: the question a script answers, and its answer."""

    script: str
    result: str  # bench/results/<result>.json
    command: str
    question: str
    setup: Describe  # the parameters the result records
    headline: Describe


BENCHES: tuple[Bench, ...] = (
    Bench(
        "batcher_echo.py",
        "batcher_echo",
        "python -m bench.batcher_echo",
        "the batches the worker forms from a backlog with the echo engine",
        lambda r: (
            f"{n(r['requests'])} requests, {r['engine']}, prefetch {r['prefetch_count']}, "
            f"max_batch_size {r['max_batch_size']}, max_batch_tokens {r['max_batch_tokens']}"
        ),
        batcher_echo_headline,
    ),
    Bench(
        "formation.py",
        "formation",
        "python -m bench.formation",
        "FIFO vs length-aware vs length-aware + shared-prefix batch formation",
        lambda r: (
            f"{r['model']}, prompts {'–'.join(map(str, r['workload']['prompt_tokens']))} "
            f"tokens, {r['workload']['shared_fraction'] * 100:.0f} % of them starting with one "
            f"{r['workload']['shared_system_prompt_tokens']}-token system prompt, max_tokens "
            f"{'–'.join(map(str, r['workload']['max_tokens']))}"
        ),
        formation_headline,
    ),
    Bench(
        "engine_cpu.py",
        "engine_cpu",
        "python -m bench.engine_cpu",
        "tokens/s of the hf engine at static batch sizes",
        lambda r: (
            f"{r['model']}, batch {'/'.join(str(x['batch_size']) for x in r['results'])}, "
            f"{r['new_tokens_per_request']} forced new tokens, best of {r['rounds']} rounds"
        ),
        engine_cpu_headline,
    ),
    Bench(
        "vllm_direct.py",
        "vllm_direct",
        "python -m bench.vllm_direct",
        "vLLM fed directly: static waves vs requests kept in flight",
        lambda r: (
            f"{r['model']}, vllm {r['vllm']}, {r['requests']} requests ({r['workload']}), "
            f"{r['wave_size']} at a time"
        ),
        lambda r: "; ".join(
            f"{run['dtype']}: waves {run['modes']['waves']['tokens_per_s']} tok/s, in flight "
            f"{run['modes']['in_flight']['tokens_per_s']} tok/s, {x(run['in_flight_vs_waves'])}"
            for run in r["runs"]
        ),
    ),
    Bench(
        "overhead.py",
        "overhead",
        "python -m bench.overhead",
        "requests/s of the worker with the echo engine vs a raw confluent-kafka passthrough "
        "on the same broker and messages; CPU µs per request by stage",
        lambda r: (
            f"{n(r['requests'])} requests of {r['request_value_bytes']:.0f} B; batching: "
            f"{r['batching']}"
        ),
        overhead_headline,
    ),
    Bench(
        "wire.py",
        "wire",
        "python -m bench.wire",
        "protobuf+zstd vs JSON (and JSON+zstd) for realistic request and result messages",
        lambda r: f"{n(r['messages'])} messages; {r['timing']}",
        wire_headline,
    ),
    Bench(
        "realtime.py",
        "realtime",
        "python -m bench.realtime",
        "the same requests (a) one at a time, (b) through the worker, (c) fed to the engine "
        "directly, for hf and vllm; the faster (b) is the default CPU engine",
        lambda r: (
            f"{r['model']}, {r['requests']} requests of {r['max_tokens']} tokens; "
            f"{r.get('note', '')}"
        ),
        realtime_headline,
    ),
    Bench(
        "adaptive.py",
        "adaptive",
        "python -m bench.adaptive",
        "fixed batch sizes vs the adaptive controller, steady and bursty arrivals",
        lambda r: (
            f"steady {r['arrival_rate_per_s']} req/s for {r['duration_s']:g} s, or "
            f"bursty: {r['bursty']}; engine: {r['engine']}"
        ),
        adaptive_headline,
    ),
    Bench(
        "api.py",
        "api",
        "python -m bench.api",
        "the OpenAI API path (upload, create, published) vs `batchpipe submit` on the same "
        "file, and the server's memory while it takes the upload",
        lambda r: f"{n(r['lines'])} lines, {r['file_bytes']} bytes; {r['note']}",
        api_headline,
    ),
    Bench(
        "inflight.py",
        "inflight",
        "python -m bench.inflight",
        "the same requests through the worker, static batches vs in flight (echo: padded "
        "batches, every row kept until the longest ends; vllm: the engine fed one batch at a "
        "time); the worker's RSS under a backlog in flight",
        inflight_setup,
        inflight_headline,
    ),
    Bench(
        "structured.py",
        "structured",
        "python -m bench.structured",
        "response_format json_schema through xgrammar: valid outputs and the throughput cost",
        lambda r: (
            f"{r['model']}, {r['requests']} requests over {r['schemas']} schemas, batches of "
            f"{r['batch_size']}, max_tokens {r['max_tokens']}, greedy"
        ),
        structured_headline,
    ),
    Bench(
        "embeddings.py",
        "embeddings",
        "python -m bench.embeddings",
        "/v1/embeddings requests one at a time vs batched (directly, and through the worker)",
        lambda r: (
            f"{r['model']}, {r['requests']} requests ({r['workload']}), batches of "
            f"{r['batch_size']}"
        ),
        embeddings_headline,
    ),
    Bench(
        "broker_earliest.py",
        "broker_earliest",
        "python -m bench.broker_earliest",
        "the embedded broker's earliest offset after concurrent transactional producers, "
        "and what a reader from OFFSET_BEGINNING vs offset 0 (FROM_START) gets",
        lambda r: (
            f"{r['broker']}, {r['trials']} one-partition topics, {r['producers']} producers "
            "committing one record each at once"
        ),
        lambda r: (
            f"earliest offset above 0 in {r['wrong_earliest']} of {r['trials']} topics; "
            f"records missed from OFFSET_BEGINNING: {r['lost_from_beginning']}, from offset 0: "
            f"{r['lost_from_start']} (of {n(r['records'])})"
        ),
    ),
    Bench(
        "gpu_check.sh",
        "gpu_check",
        "bench/gpu_check.sh",
        "one NVIDIA GPU, random-weight Llama: the hf engine with and without the pinned pool, "
        "the trtllm engine in flight and vLLM on dummy weights",
        lambda r: f"{r['model']}, {r['prompt_tokens']} prompt + {r['new_tokens']} new tokens",
        gpu_headline,
    ),
    Bench(
        "latency.py",
        "latency",
        "python -m bench.latency",
        "how long a request waits at half and a tenth of capacity (issue 29's goals)",
        lambda r: (
            f"echo static and in flight, {r['setup']['max_tokens']} tokens at "
            f"{r['setup']['step_s'] * 1000:.0f} ms a step, {r['setup']['seconds_per_load']:.0f} s "
            "a load, capacity measured first in the same run"
        ),
        latency_headline,
    ),
    Bench(
        "fairness.py",
        "fairness",
        "python -m bench.fairness",
        "small batches arriving while a large one runs, FIFO vs fair share (issues 23, 33, 39)",
        lambda r: (
            f"one worker, echo at 20 ms and at 1 s a step, {r['setup']['small_batches']} "
            f"batches of {r['setup']['small']} every {r['setup']['every_s']} s behind "
            f"{n(r['paces']['0.02']['large'])} and {n(r['paces']['1']['large'])}; three "
            f"workers at 1 s; {n(r['mixed_lengths']['requests'])} mixed-length requests on "
            f"the in-flight engine at 20 ms a step; {r['setup']['small_batches'] // 2} small "
            f"batches behind {n(r['cancel']['large'])} after a "
            f"{n(r['cancel']['doomed'])}-request cancel; the mover alone with "
            f"{n(r['mover']['64']['requests'])} requests"
        ),
        fairness_headline,
    ),
    Bench(
        "remote.py",
        "remote",
        "python -m bench.remote",
        "a server batchpipe does not host: throughput against a direct client, and "
        "interactive latency with batch work on top (issue 35)",
        lambda r: (
            f"stand-in server at {r['setup']['token_s'] * 1000:.0f} ms a step + "
            f"{r['setup']['per_seq_s'] * 1000:.1f} ms a sequence, {r['setup']['max_running']} "
            f"running at most; {r['setup']['interactive_clients']} interactive clients, "
            f"{r['setup']['burst_s']:.0f} s bursts and {r['setup']['idle_s']:.0f} s idle × "
            f"{r['setup']['cycles']}"
        ),
        remote_headline,
    ),
)
