"""Every exception class the project defines derives from the one BatchpipeError base."""

from __future__ import annotations

import ast
import builtins

from tests import ROOT

PACKAGES = ("batcher", "worker", "batchpipe")
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def classes_on_builtin_exceptions() -> dict[str, list[str]]:
    """``module:Class`` → its base names, for every class with a builtin exception base."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if set(bases) & BUILTIN_EXCEPTIONS:
                    found[f"{path.relative_to(ROOT)}:{node.name}"] = bases
    return found


def test_every_exception_class_derives_from_batchpipe_error() -> None:
    found = classes_on_builtin_exceptions()
    assert found.pop("batcher/errors.py:BatchpipeError") == ["Exception"]
    assert "worker/config.py:ConfigError" in found  # the scan sees the other packages too
    offenders = {name: bases for name, bases in found.items() if "BatchpipeError" not in bases}
    assert not offenders
