"""What a testbed measurement found: one :class:`Row` per (scenario, s, method), and the rows as Markdown tables.

:func:`table` lists every row (nDCG@10 with its standard error over draws, the share of "reads" decisions);
:func:`pivot` puts the methods of :data:`PIVOT` side by side, one line per (scenario, s). :mod:`.measure`
makes the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Row", "table", "PIVOT", "pivot"]


@dataclass(frozen=True)
class Row:
    scenario: str
    s: float
    method: str
    ndcg10: float
    reads_share: float | None
    ndcg10_se: float = 0.0  # standard error over draws
    draws: int = 0
    lists: int = 0
    seconds: float = 0.0  # per ranking
    calibrated_share: float | None = None  # lists (windows) ranked calibrated, not kept in their given order
    requests: float = 0.0  # per ranking, the probe included once per draw
    prompt_tokens: float = 0.0  # per ranking, as the server reports them
    uncached_tokens: float = 0.0  # per ranking, prompt tokens not served from a slot's cache
    note: str = ""
    shape: str = "fixed"  # the traffic shape (SHAPES)
    passages: float = 0.0  # mean passages per list ranked

    def json(self) -> dict[str, Any]:
        out = {"scenario": self.scenario, "s": self.s, "method": self.method, "ndcg10": round(self.ndcg10, 4),
               "reads_share": None if self.reads_share is None else round(self.reads_share, 4)}
        return out if self.shape == "fixed" else {**out, "shape": self.shape}

    @property
    def cell(self) -> str:
        """The scenario, and the shape unless ``fixed``."""
        return self.scenario if self.shape == "fixed" else f"{self.scenario} / {self.shape}"


def _best_alpha(row: Row) -> str:
    """The alpha a ``capcal-best`` row names first in its note (``"alpha 1.5; ..."``)."""
    return row.note.split(";")[0].split()[-1]


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table: scenario, s, method, nDCG@10 (standard error over draws), reads share."""
    out = ["| scenario | s | method | nDCG@10 | reads share |", "|---|---:|---|---:|---:|"]
    for r in rows:
        share = "" if r.reads_share is None else f"{r.reads_share:.2f}"
        method = f"{r.method} (alpha {_best_alpha(r)})" if r.method == "capcal-best" and r.note else r.method
        out.append(f"| {r.cell} | {r.s:g} | {method} | {r.ndcg10:.4f} ± {r.ndcg10_se:.4f} | {share} |")
    return "\n".join(out)


#: The columns of :func:`pivot`: the methods compared against ``s``.
PIVOT = ("bm25", "vanilla", "capcal-adaptive", "capcal-1", "capcal-chosen", "capcal-best", "default")


def pivot(rows: Sequence[Row]) -> str:
    """nDCG@10 per (scenario, s) in one row each, the methods of :data:`PIVOT` as columns (the default's
    share of "reads" decisions in brackets; ``capcal-best`` with its alpha)."""
    cells = {(r.cell, r.s, r.method): r for r in rows}
    keys = list(dict.fromkeys((r.cell, r.s) for r in rows))
    out = ["| scenario | s | " + " | ".join(PIVOT) + " |", "|---|---:|" + "---:|" * len(PIVOT)]
    for name, s in keys:
        values = []
        for m in PIVOT:
            r = cells.get((name, s, m))
            text = "" if r is None else f"{r.ndcg10:.4f}"
            if r is not None and m == "default" and r.reads_share is not None:
                text += f" (reads {r.reads_share:.2f})"
            if r is not None and m == "capcal-best" and r.note:
                text += f" (alpha {_best_alpha(r)})"
            values.append(text)
        out.append(f"| {name} | {s:g} | " + " | ".join(values) + " |")
    return "\n".join(out)
