"""Sharing the fleet: fair share (bench.fairness) and a remote engine with interactive
traffic beside the batch work (bench.remote)."""

from __future__ import annotations

from bench.describe.text import Result, n, x


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
