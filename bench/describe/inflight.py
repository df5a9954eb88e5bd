"""bench.inflight: the same requests through the worker, static batches vs in flight, and
the worker's memory under a backlog."""

from __future__ import annotations

from bench.describe.text import Result, n, x


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
