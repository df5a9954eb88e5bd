"""What a parsed result is, and how its figures are written: ratios and counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Result = dict[str, Any]
Describe = Callable[[Result], str]


def x(ratio: float) -> str:
    return f"{ratio:.2f}×"


def n(value: float) -> str:
    return f"{value:,.0f}"
