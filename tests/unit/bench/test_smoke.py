"""Cheap checks of the benchmarks: they import, ``make bench`` runs each, each has a chart.

No timing is asserted here, ever: figures come from ``make bench`` on a known machine.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from bench import run_all

BENCH = Path(run_all.__file__).resolve().parent
# shared helpers, the charts, the published figures, the runner itself, the stand-in OpenAI
# server (bench.remote's and the tests'), the feeder's mover and the
# mixed-length and cancel arms and the arms they share (part of bench.fairness), the
# feeder at scale and behind an open upload (feeder_memory, feeder_open_upload: run by
# hand under the heavy lock, minutes; issue 38), builds of the worker side by side
# (builds: needs the other trees, a mypyc build or a prototype; issue 42), answers behind
# one long request and the takeover read after a million answers (straggler, takeover: run
# by hand under the heavy lock, minutes; issue 48), publishers hiding each other's batches
# and submit's lines a second before and after (publish: run by hand under the heavy lock
# with the other tree; issue 49), what partial results cost, a million-line answer log
# written, paged through the route and split (partial: run by hand under the heavy lock;
# issue 50), service tiers through serve (tiers: run by hand under the heavy lock, and by
# tests/integration/api/test_tiers_api.py; issue 50), and the check for a machine with a
# GPU (gpu_check and its sections)
NOT_BENCHMARKS = {"__init__", "common", "plot", "figures", "tables", "run_all", "mover"} | {
    "fairness_arms",
    "fairness_variants",
    "feeder_memory",
    "feeder_open_upload",
    "builds",
    "straggler",
    "takeover",
    "publish",
    "partial",
    "tiers",
    "openai_standin",
    "gpu_check",
    "gpu_check_hf",
    "gpu_check_engines",
    "gpu_check_pipeline",
}


def test_run_all_runs_every_benchmark_module() -> None:
    modules = {path.stem for path in BENCH.glob("*.py")} - NOT_BENCHMARKS
    assert set(run_all.available()) == modules


@pytest.mark.parametrize("name", run_all.BENCHMARKS)
def test_benchmark_module_imports_and_has_main(name: str) -> None:
    if name not in run_all.available():
        pytest.skip(f"bench/{name}.py is not in this checkout")
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.main)


def test_run_all_rejects_an_unknown_benchmark() -> None:
    with pytest.raises(SystemExit):
        run_all.main(["--only", "no-such-benchmark"])


def test_every_benchmark_has_a_chart() -> None:
    pytest.importorskip("matplotlib")
    from bench import plot

    assert set(run_all.BENCHMARKS) <= set(plot.CHARTS) | set(plot.OWN_CHARTS)


def test_plot_draws_a_png_for_each_result_present(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench import plot

    row = {"value_bytes": 400.0, "header_bytes": 90.0, "encode_us": 20.0, "decode_us": 30.0}
    wire = {
        "requests": [{"format": f, **row} for f in ("protobuf+zstd", "json")],
        "results": [{"format": f, **row} for f in ("protobuf+zstd", "json")],
    }
    (tmp_path / "wire.json").write_text(json.dumps(wire))
    written = plot.main(tmp_path)
    assert written == [tmp_path / "wire.png"]
    assert (tmp_path / "wire.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
