"""A stand-in ``tensorrt_llm`` package (in ``tensorrt_llm/`` here) for tests without a GPU.

Tests put this folder first on ``sys.path`` (:func:`install`; :func:`uninstall` undoes it),
so ``import tensorrt_llm`` finds the stand-in; ``tensorrt_llm/__init__.py`` says what it
mimics and from which sources.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).parent


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import tensorrt_llm`` load the stand-in until :func:`uninstall`.

    A real ``tensorrt_llm`` already imported is set aside and put back by ``monkeypatch``.
    """
    for name in _loaded():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FOLDER))


def uninstall() -> None:
    """Forget the imported stand-in, so no later ``import tensorrt_llm`` finds it."""
    for name in _loaded():
        if str(getattr(sys.modules[name], "__file__", "")).startswith(str(FOLDER)):
            del sys.modules[name]


def _loaded() -> list[str]:
    return [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]
