"""bench/gpu_check_engines.py's trtllm section, run on the stand-in ``tensorrt_llm``.

The GPU check itself runs only on a machine with an NVIDIA GPU (bench/gpu_check.sh); this
runs its trtllm section's logic — the dummy-weight checkpoint, feeding by capacity, the
alone-vs-in-flight comparison and the abort check — where no GPU is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_check_engines
from tests.unit.worker.engines.fake_trtllm import install, uninstall


def test_the_trtllm_section_feeds_the_engine_by_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch)
    try:
        out = tmp_path / "trtllm.json"
        argv = ["--engine", "trtllm", "--batch-sizes", "1,4", "--layers", "1", "--out", str(out)]
        result = gpu_check_engines.main(argv)
    finally:
        uninstall()
    assert json.loads(out.read_text()) == result
    assert (result["requests"], result["completed"], result["errors"]) == (8, 8, [])
    assert result["identical_alone_and_in_flight"] == "4/4"
    assert result["abort_never_completed"] is True
    assert result["tokens_per_s"] > 0 and result["batch"] == 4
