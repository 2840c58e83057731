"""What a decision from labels saw: each judged query's nDCG@10 in its given order and calibrated, the
queries calibrating helped and hurt most, and a picture of every query's difference beside the decision's mean
gain, its interval and its outcome (an SVG written here: no plotting library needed).

The decision (:meth:`~capcal_integrations.CapCalReranker.decide`) is taken as it comes, from its public fields
(``gain``, ``gain_low``, ``gain_high``, ``judged``, ``reads``); the per-query values are the calibrated rankings
asked again with the decision's own options (``guard=None``, as deciding ranks), which a server's prompt cache
mostly answers.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..content_check.judged import judged_triples, ndcg10

__all__ = ["QueryRow", "per_query", "extremes", "summary", "svg", "report"]


@dataclass(frozen=True)
class QueryRow:
    """One judged query: nDCG@10 of its given order and of the calibrated ranking."""

    query: str
    given: float
    calibrated: float

    @property
    def difference(self) -> float:
        return self.calibrated - self.given


def per_query(reranker: Any, triples: Sequence[tuple[str, Sequence[Any], Sequence[int]]]) -> list[QueryRow]:
    """Each usable judged query (:func:`~capcal_integrations.content_check.judged.judged_triples`) ranked
    calibrated, without the check, as deciding ranks it."""
    calibrated = reranker.with_options(guard=None)
    rows = []
    for query, passages, grades in judged_triples(triples):
        order = calibrated.rerank(query, passages).order
        rows.append(QueryRow(query, ndcg10(range(len(grades)), grades), ndcg10(order, grades)))
    return rows


def extremes(rows: Sequence[QueryRow], n: int = 3) -> tuple[list[QueryRow], list[QueryRow]]:
    """The ``n`` queries calibrating hurt most (worst first) and the ``n`` it helped most (best first), neither
    overlapping the other.

    >>> rows = [QueryRow(q, 0.5, 0.5 + d) for q, d in zip("abcd", (0.1, -0.2, 0.3, 0.0))]
    >>> [[r.query for r in side] for side in extremes(rows, 1)], [[r.query for r in s] for s in extremes(rows, 3)]
    ([['b'], ['c']], [['b', 'd'], ['c', 'a']])
    """
    ranked = sorted(rows, key=lambda r: r.difference)
    worst = ranked[:min(n, len(ranked) // 2)]
    best = ranked[::-1][:min(n, len(ranked) - len(worst))]
    return worst, best


def summary(rows: Sequence[QueryRow], decision: Any, n: int = 3) -> list[str]:
    """Lines for a terminal: the outcome, then the worst and best queries with their nDCG@10."""
    worst, best = extremes(rows, n)

    def line(r: QueryRow) -> str:
        return f"  {r.difference:+.3f}  ({r.given:.3f} -> {r.calibrated:.3f})  {r.query[:90]}"

    outcome = "calibrate" if decision.reads else "keep the given order"
    return [f"what the decision saw: {len(rows)} queries, mean nDCG@10 gain {decision.gain:+.3f} (95 % interval "
            f"{decision.gain_low:+.3f} to {decision.gain_high:+.3f}): {outcome}",
            "worst (calibrated minus given nDCG@10):", *map(line, worst),
            "best:", *map(line, best)]


def svg(rows: Sequence[QueryRow], decision: Any) -> str:
    """The per-query differences as bars (sorted), with the decision's mean gain and its interval as a band.

    >>> from types import SimpleNamespace as D
    >>> text = svg([QueryRow("q", 0.2, 0.5)], D(reads=True, gain=0.3, gain_low=0.1, gain_high=0.5))
    >>> text.startswith("<svg") and "calibrate" in text and text.count("<rect") == 3
    True
    """
    ranked = sorted(rows, key=lambda r: r.difference)
    width, height, left, top, bottom = max(480, 60 + 8 * len(ranked)), 300, 50, 40, 30
    plot_w, plot_h = width - left - 10, height - top - bottom
    span = max([0.1, abs(decision.gain_low), abs(decision.gain_high), *(abs(r.difference) for r in ranked)])

    def y(v: float) -> float:
        return top + plot_h / 2 - v / span * plot_h / 2

    bar = plot_w / max(1, len(ranked))
    outcome = "calibrate" if decision.reads else "keep the given order"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="18">{html.escape(f"nDCG@10, calibrated minus given order, per query ({len(ranked)}): ")}'
             f'<tspan font-weight="bold">{outcome}</tspan></text>',
             f'<rect x="{left}" y="{y(decision.gain_high):.1f}" width="{plot_w}" '
             f'height="{max(0.5, y(decision.gain_low) - y(decision.gain_high)):.1f}" fill="#4a90d9" opacity="0.2">'
             f'<title>95 % interval {decision.gain_low:+.3f} to {decision.gain_high:+.3f}</title></rect>']
    for i, r in enumerate(ranked):
        y0, y1 = sorted((y(0.0), y(r.difference)))
        colour = "#2e7d32" if r.difference > 0 else "#c62828"
        parts.append(f'<rect x="{left + i * bar + bar * 0.1:.1f}" y="{y0:.1f}" width="{bar * 0.8:.1f}" '
                     f'height="{max(0.5, y1 - y0):.1f}" fill="{colour}"><title>{html.escape(r.query)}: '
                     f'{r.given:.3f} -> {r.calibrated:.3f}</title></rect>')
    parts += [f'<line x1="{left}" x2="{left + plot_w}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="black"/>',
              f'<line x1="{left}" x2="{left + plot_w}" y1="{y(decision.gain):.1f}" y2="{y(decision.gain):.1f}" '
              f'stroke="#1a5fb4" stroke-dasharray="4 3"/>',
              f'<text x="{left - 4}" y="{y(span) + 4:.1f}" text-anchor="end">{span:+.2f}</text>',
              f'<text x="{left - 4}" y="{y(0) + 4:.1f}" text-anchor="end">0</text>',
              f'<text x="{left - 4}" y="{y(-span) + 4:.1f}" text-anchor="end">{-span:+.2f}</text>',
              f'<text x="{left}" y="{height - 8}">mean {decision.gain:+.3f} (dashed), 95 % interval '
              f'{decision.gain_low:+.3f} to {decision.gain_high:+.3f} (band); bars: queries, worst to best</text>',
              "</svg>"]
    return "\n".join(parts) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def report(reranker: Any, triples: Sequence[Any], decision: Any, out: str | None, stream: TextIO) -> list[QueryRow]:
    """Rank each query calibrated (:func:`per_query`), write :func:`summary` to ``stream`` and, with ``out``, the
    decision (``decision.json``), each query's nDCG@10 (``queries.tsv``) and the plot (``queries.svg``) there."""
    rows = per_query(reranker, triples)
    stream.write("\n".join(summary(rows, decision)) + "\n")
    if out:
        os.makedirs(out, exist_ok=True)
        _write(os.path.join(out, "decision.json"), decision.to_json() + "\n")
        _write(os.path.join(out, "queries.tsv"), "given\tcalibrated\tdifference\tquery\n" + "".join(
            f"{r.given:.4f}\t{r.calibrated:.4f}\t{r.difference:+.4f}\t{_one_line(r.query)}\n" for r in rows))
        _write(os.path.join(out, "queries.svg"), svg(rows, decision))
        stream.write(f"saved: {out}/decision.json, queries.tsv, queries.svg\n")
    return rows
