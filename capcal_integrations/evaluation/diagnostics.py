"""Report sections that investigate *why*: where the model has signal, how much content the first step
sees, and what calibration strength shuffle consistency would pick without labels."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..calibration.formulas import FORMS
from . import analysis as A
from .data import Dataset
from .markdown import fmt, table
from .specs import MethodSpec
from .store import Store

__all__ = ["signal_section", "content_section", "sweep_section", "ALPHA_GRID"]

ALPHA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def signal_section(store: Store, q: A.Quality, out: list[str]) -> None:
    """Does calibration help where the model is sure (has content signal) or where it is unsure?"""
    split = A.signal_split(store)
    if split is None or "vanilla" not in q.per_query:
        return
    sure, unsure, median = split
    rows = []
    for label in q.per_query:
        if label.startswith("psc*"):
            continue
        cells = []
        for part in (sure, unsure):
            qids = [x for x in part if x in q.per_query[label]["nDCG@10"]]
            base = [x for x in qids if x in q.per_query["vanilla"]["nDCG@10"]]
            delta = (q.mean(label, "nDCG@10", base) - q.mean("vanilla", "nDCG@10", base)) if base else float("nan")
            cells += [fmt(q.mean(label, "nDCG@10", qids)) if qids else "–",
                      "–" if label == "vanilla" or math.isnan(delta) else f"{delta:+.4f}"]
        rows.append([f"`{label}`", *cells])
    out += [f"Queries split at the median normalised entropy ({median:.3f}) of vanilla's first decoding step "
            f"(label-free): {len(sure)} queries where the model is surer, {len(unsure)} where it is less sure.\n",
            table(["method", "nDCG@10 (surer half)", "Δ vs vanilla", "nDCG@10 (unsure half)", "Δ vs vanilla"], rows),
            ""]


def content_section(dataset: Dataset, store: Store, specs: Sequence[MethodSpec], out: list[str]) -> None:
    """AUC of the first-step probabilities: does the model see content at all, before and after calibration?"""
    grades, rel = dataset.grades(), dataset.rel_threshold
    bm25 = {t.qid: {c.docid: c.bm25_score for c in t.candidates} for t in dataset.topics}
    rows = []
    for s in specs:
        cells = []
        for kind in ("rank", "shuffle"):
            for field_ in ("p", "s"):
                value, n = A.content_auc(store, s.key, grades, rel, kind=kind, field_=field_)
                cells.append(f"{value:.3f} ({n})" if n and (field_ == "p" or s.calibrated) else "–")
        if any(c != "–" for c in cells):
            rows.append([f"`{s.label}`", *cells])
    if not rows:
        return
    aucs = []
    for t in dataset.topics:
        g = grades.get(t.qid, {})
        top = [c.docid for c in t.candidates[:20]]
        aucs.append(A.auc([bm25[t.qid][d] for d in top if g.get(d, 0) >= rel],
                          [bm25[t.qid][d] for d in top if d in g and g[d] == 0]))
    ok = [a for a in aucs if not math.isnan(a)]
    out += [table(["method", "AUC of p, BM25 order (queries)", "AUC of calibrated s, BM25 order",
                   "AUC of p, mean over shuffles", "AUC of calibrated s, mean over shuffles"], rows), ""]
    out.append("First decoding step as a relevance scorer: AUC of relevant (grade ≥ "
               f"{rel}) against judged non-relevant passages of the top-20, per query, averaged (0.5 = no content "
               "signal). Averaging a passage's probability over random shuffles removes the slot effect. "
               f"For reference, the BM25 score itself has AUC {sum(ok) / max(len(ok), 1):.3f} on these lists.\n")


def sweep_section(dataset: Dataset, store: Store, out: list[str]) -> None:
    """Offline alpha sweep of first-token-capcal (exact: its ranking is a function of the stored p, q)."""
    rows = []
    for form in FORMS:
        ranked = A.first_token_sweep(store, "first-token-capcal", ALPHA_GRID, form=form)
        shuffled = A.first_token_sweep(store, "first-token-capcal", ALPHA_GRID, form=form, kind="shuffle")
        if not any(ranked.values()):
            return
        q = A.quality(dataset, {f"{a}": recs for a, recs in ranked.items()})
        taus = {a: A.consistency_over_queries(recs)[0] for a, recs in shuffled.items()}
        best = max(taus, key=lambda a: (taus[a] if not math.isnan(taus[a]) else -9, -a)) if taus else None
        for a in ALPHA_GRID:
            mark = " ← label-free choice" if best == a and not math.isnan(taus.get(a, float("nan"))) else ""
            rows.append([form, f"{a:g}", fmt(q.mean(f"{a}") if f"{a}" in q.per_query else None),
                         fmt(taus.get(a), 3) + mark])
    out += [table(["calibration", "alpha", "nDCG@10 (first-token-capcal, rank runs)",
                   "mean τ between shuffles (unlabeled)"], rows), ""]
    out.append("Computed offline from the stored first-step distributions p (real) and q (empty prompt): no model "
               "calls. The label-free choice maximises shuffle consistency and never looks at relevance labels.\n")
    tau, n = A.slot_profile_consistency(store, "first-token")
    if n:
        out.append(f"For scale: ranking each shuffled list's first step by log p minus the *real* prompt's own mean "
                   f"slot profile (estimated from all the shuffles, so the best any per-slot correction could do) gives a "
                   f"mean τ between shuffles of {tau:.3f} ({n} queries). Near 0 means that once the slot is removed, "
                   "little consistent content signal is left for any calibration to reveal.\n")
