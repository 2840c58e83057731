"""Markdown helpers for reports."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["fmt", "pvalue", "table"]


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def pvalue(x: float) -> str:
    return "–" if math.isnan(x) else (f"{x:.3f}" if x >= 0.001 else "<0.001")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"
    return "\n".join(["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(r) + " |" for r in rows])
