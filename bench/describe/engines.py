"""The engines' own benchmarks: realtime (batching vs one at a time, hf vs vllm),
engine_cpu, vllm_direct, structured outputs, embeddings, and the GPU check."""

from __future__ import annotations

from bench.describe.text import Result, n, x


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


def engine_cpu_short(r: Result) -> str:
    top, *others = reversed(r["results"][1:])
    more = ", ".join(f"{x(row['ratio_vs_batch_1'])} at {row['batch_size']}" for row in others)
    identical = sorted({row["greedy_identical_to_alone"] for row in r["results"][1:]})
    return (
        f"**{x(top['ratio_vs_batch_1'])}** tokens/s at batch {top['batch_size']} ({more}); "
        f"greedy output identical alone and batched: {', '.join(identical)}"
    )


def engine_cpu_headline(r: Result) -> str:
    rates = " / ".join(str(row["tokens_per_s"]) for row in r["results"])
    return f"{rates} tok/s; {engine_cpu_short(r).replace('**', '')}"


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
