"""The committed generated code matches proto/, and only worker/wire/codec.py uses it."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests import ROOT


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_generated_code_is_fresh(generate: ModuleType) -> None:
    assert generate.main(["--check"]) == 0, "run `make proto` and commit worker/wire/_generated"


def test_check_fails_on_stale_or_extra_files(generate: ModuleType, tmp_path: Path) -> None:
    stale = tmp_path / "generated"
    shutil.copytree(generate.GENERATED, stale, ignore=shutil.ignore_patterns("__pycache__"))
    module = stale / "batchpipe" / "v1" / "inference_pb2.py"
    module.write_text(module.read_text().replace("custom_id", "customer_id"))
    assert generate.main(["--check", "--out", str(stale)]) == 1
    shutil.copy(generate.GENERATED / "batchpipe" / "v1" / "inference_pb2.py", module)
    assert generate.main(["--check", "--out", str(stale)]) == 0
    (stale / "batchpipe" / "v1" / "old_pb2.py").write_text("")
    assert generate.main(["--check", "--out", str(stale)]) == 1


def test_only_the_codec_imports_generated_code() -> None:
    pattern = re.compile(r"wire\._generated|wire import _generated|inference_pb2")
    allowed = {
        ROOT / "worker" / "wire" / "codec.py",
        ROOT / "worker" / "wire" / "progress.py",  # the progress topic's records
        Path(__file__).resolve(),
        # its reference decoder reads the protobuf message directly, as the codec did
        Path(__file__).resolve().parent / "test_decode_fuzz.py",
    }
    offenders = [
        str(path.relative_to(ROOT))
        for top in ("worker", "batcher", "batchpipe", "bench", "tests")
        for path in (ROOT / top).rglob("*.py")
        if "_generated" not in path.parts
        and path not in allowed
        and pattern.search(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert offenders == []
