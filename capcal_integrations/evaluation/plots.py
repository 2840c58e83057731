"""PNG plots for the report (matplotlib, Agg backend; imported only when a report is written)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["quality_plot", "top1_plot", "needle_plot", "cost_plot", "delta_plot"]

_DPI = 110


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def quality_plot(per_query: Mapping[str, Mapping[str, float]], path: pathlib.Path, measure: str = "nDCG@10"
                 ) -> pathlib.Path:
    """One box per method with every query as a dot and the mean as a diamond."""
    labels = list(per_query)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2), 4.2))
    data = [list(per_query[k].values()) for k in labels]
    ax.boxplot(data, showfliers=False, widths=0.5)
    for i, values in enumerate(data, 1):
        jitter = [i + 0.18 * ((j * 37 % 11) / 10 - 0.5) for j in range(len(values))]
        ax.scatter(jitter, values, s=9, alpha=0.45, color="tab:blue", zorder=3)
        if values:
            ax.scatter([i], [sum(values) / len(values)], marker="D", s=40, color="tab:red", zorder=4)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{measure} per query")
    ax.set_title(f"{measure}: per-query spread (dots), mean (red diamond)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def top1_plot(histograms: Mapping[str, Sequence[int]], first_step: Mapping[str, Sequence[float]],
              prior: Sequence[float] | None, path: pathlib.Path) -> pathlib.Path:
    """Left: share of shuffled lists whose top-ranked passage sat at each input slot. Right: mean first-step
    probability (calibrated share for calibrated methods) by slot, and the empty-prompt prior."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = list(histograms)
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        counts = histograms[label]
        total = sum(counts) or 1
        xs = [p + 1 - 0.4 + width * (i + 0.5) for p in range(len(counts))]
        left.bar(xs, [c / total for c in counts], width=width, label=label)
    if labels:
        n = len(histograms[labels[0]])
        left.axhline(1 / n, color="black", lw=0.8, ls="--", label="uniform")
        left.set_xticks(range(1, n + 1))
    left.set_xlabel("input slot of the top-ranked passage")
    left.set_ylabel("share of shuffled lists")
    left.set_title("Top-1 input position over random shuffles")
    left.legend(fontsize=7)
    for label, values in first_step.items():
        if values:
            right.plot(range(1, len(values) + 1), values, marker="o", ms=3, label=label)
    if prior:
        right.plot(range(1, len(prior) + 1), prior, color="black", ls=":", marker="x", ms=4,
                   label="empty-prompt prior q")
    if first_step or prior:
        right.set_xticks(range(1, len(prior or next(iter(first_step.values()))) + 1))
    right.set_xlabel("input slot")
    right.set_ylabel("mean first-step probability / share")
    right.set_title("First decoding step by slot (mean over lists)")
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return _save(fig, path)


def needle_plot(ranks: Mapping[str, Mapping[str, Mapping[int, int]]], path: pathlib.Path, n: int = 20
                ) -> pathlib.Path:
    """Rank of the needle by its input position: mean over queries (thick), each query (thin)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for i, (label, by_query) in enumerate(ranks.items()):
        color = f"C{i % 10}"
        positions = sorted({p for per in by_query.values() for p in per})
        for per in by_query.values():
            ps = sorted(per)
            ax.plot(ps, [per[p] for p in ps], color=color, lw=0.6, alpha=0.35)
        means = [sum(per[p] for per in by_query.values() if p in per) /
                 max(1, sum(p in per for per in by_query.values())) for p in positions]
        ax.plot(positions, means, color=color, lw=2.2, marker="o", ms=4, label=f"{label} ({len(by_query)} q)")
    ax.set_xlabel("input position of the relevant passage (1 = first)")
    ax.set_ylabel("its rank in the output (1 = top)")
    ax.set_ylim(n + 0.5, 0.5)
    ax.set_yticks(sorted({1, *range(5, n + 1, 5)}))
    ax.set_xticks(range(1, n + 1))
    ax.set_title("Needle test: a flat line near rank 1 is the goal")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def cost_plot(points: Mapping[str, tuple[float, float]], path: pathlib.Path, xlabel: str = "seconds per query"
              ) -> pathlib.Path:
    """Cost (x) against quality (y), one labelled point per method."""
    fig, ax = plt.subplots(figsize=(7, 4.4))
    for i, (label, (x, y)) in enumerate(points.items()):
        ax.scatter([x], [y], s=40, color=f"C{i % 10}")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean nDCG@10")
    ax.set_title("Cost vs quality")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def delta_plot(deltas: Mapping[str, Mapping[str, float]], path: pathlib.Path, baseline: str = "vanilla"
               ) -> pathlib.Path:
    """Per-query nDCG@10 difference to ``baseline``, sorted, one panel row per method."""
    labels = list(deltas)
    fig, axes = plt.subplots(len(labels), 1, figsize=(8, 1.9 * len(labels) + 0.6), squeeze=False)
    for ax, label in zip(axes[:, 0], labels, strict=True):
        values = sorted(deltas[label].values(), reverse=True)
        ax.bar(range(len(values)), values, color=["tab:green" if v > 0 else "tab:red" for v in values])
        ax.axhline(0, color="black", lw=0.6)
        wins, losses = sum(v > 0 for v in values), sum(v < 0 for v in values)
        ax.set_title(f"{label} - {baseline}: {wins} better, {losses} worse, {len(values) - wins - losses} equal",
                     fontsize=9)
        ax.set_ylabel("Δ nDCG@10", fontsize=8)
        ax.set_xticks([])
    return _save(fig, path)
