"""From stored records to numbers: quality, significance, position bias, needle ranks and cost (:mod:`.cost`).

Everything here reads a :class:`~.store.Store` and computes; no reranking, no plotting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..calibration.formulas import shares
from ..ranking.orders import borda, order_of_scores
from ..tuning import calibrated_order
from .bias import (
    expected_kl_uniform,
    kendall_tau,
    kl_from_uniform,
    mean_by_position,
    mean_pairwise_tau,
    position_histogram,
    rank_of,
)
from .cost import Cost, cost, standalone_seconds  # noqa: F401 - re-exported
from .data import Dataset, ScoredDoc, run_of
from .metrics import CANDIDATES_NDCG, MEASURES, PairedTest, mean, paired_test, per_query
from .store import Store

__all__ = ["Quality", "quality", "Bias", "bias", "input_tau", "needle_ranks", "auc", "content_auc", "signal_split",
           "Cost", "cost", "standalone_seconds", "borda_of_shuffles",
           "first_token_sweep", "run_for", "shuffled_quality", "slot_profile_consistency",
           "consistency_over_queries"]


def run_for(dataset: Dataset, records: Sequence[dict[str, Any]]) -> list[ScoredDoc]:
    """A full run: each record's reranked list, then the rest of the query's candidates in first-stage order."""
    tails = {t.qid: [c.docid for c in t.candidates] for t in dataset.topics}
    return [d for rec in records for d in run_of(rec["qid"], rec["order"], tails.get(rec["qid"], ()))]


@dataclass
class Quality:
    """Per method (label): per-query values of every measure, on the queries the method finished."""

    per_query: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # label -> measure -> qid -> v

    def mean(self, label: str, measure: str = "nDCG@10", qids: Sequence[str] | None = None) -> float:
        values = self.per_query[label][measure]
        return mean([values[q] for q in (qids if qids is not None else values) if q in values])

    def qids(self, label: str) -> list[str]:
        return list(self.per_query[label]["nDCG@10"])

    def test(self, a: str, b: str, measure: str = "nDCG@10") -> PairedTest:
        return paired_test(self.per_query[a][measure], self.per_query[b][measure])


def quality(dataset: Dataset, runs: dict[str, Sequence[dict[str, Any]]]) -> Quality:
    """``runs``: label -> rank-like records (``qid``, ``order``), e.g. ``list(store.select("rank", key))``.
    Only queries of ``dataset`` with at least one judgement count."""
    judged = {q.query_id for q in dataset.qrels}
    wanted = {t.qid for t in dataset.topics} & judged
    out = Quality()
    for label, records in runs.items():
        recs = [r for r in records if r["qid"] in wanted]
        if recs:
            qids = [r["qid"] for r in recs]
            out.per_query[label] = per_query(dataset.qrels, run_for(dataset, recs), qids, dataset.rel_threshold)
    return out


def shuffled_quality(dataset: Dataset, store: Store, key: str, kind: str = "shuffle", *,
                     input_order: bool = False) -> tuple[float, int]:
    """Mean nDCG@10 of a method over its shuffled lists (per query the mean over its shuffles, then the
    mean over queries), and the number of queries: quality when the input order carries no first-stage signal.
    ``input_order=True`` scores the shuffled input lists themselves (the random-order baseline)."""
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for rec in store.select(kind, key):
        by_variant.setdefault(rec["variant"], []).append({**rec, "order": rec["input"]} if input_order else rec)
    by_query: dict[str, list[float]] = {}
    for variant, recs in by_variant.items():
        for qid, v in quality(dataset, {variant: recs}).per_query.get(variant, {}).get("nDCG@10", {}).items():
            by_query.setdefault(qid, []).append(v)
    return mean([mean(v) for v in by_query.values()]), len(by_query)


def borda_of_shuffles(store: Store, key: str, kind: str = "shuffle") -> list[dict[str, Any]]:
    """PSC for free: per query, Borda aggregation (the core's :func:`~capcal_integrations.borda`) of the
    method's rankings of the stored shuffles. Returns rank-like records (``qid``, ``order``, ``m``)."""
    by_query: dict[str, list[dict[str, Any]]] = {}
    for rec in store.select(kind, key):
        by_query.setdefault(rec["qid"], []).append(rec)
    out = []
    for qid, recs in by_query.items():
        if len(recs) < 2:
            continue
        items = sorted(recs[0]["input"])
        index = {d: i for i, d in enumerate(items)}
        order = borda([[index[d] for d in r["order"]] for r in recs], len(items))
        out.append({"qid": qid, "order": [items[i] for i in order], "m": len(recs)})
    return out


@dataclass
class Bias:
    """Shuffle-based bias of one method: top-1 input positions, KL from uniform (with the KL a
    position-free ranker would show from sampling noise alone), mean pairwise Kendall tau across a
    query's shuffles, mean tau between each output and its own input order (1 = the input order was
    copied), and mean first-step probability (and calibrated share) by input slot."""

    lists: int
    queries: int
    histogram: list[int]
    kl: float
    kl_noise: float
    tau: float
    tau_input: float
    first_p: list[float]
    first_s: list[float]


def bias(store: Store, key: str, n: int, kind: str = "shuffle") -> Bias | None:
    recs = [r for r in store.select(kind, key) if len(r["input"]) == n]
    if not recs:
        return None
    positions = [r["input"].index(r["order"][0]) + 1 for r in recs]
    hist = position_histogram(positions, n)
    tau, _ = consistency_over_queries(recs)
    queries = len({r["qid"] for r in recs})
    firsts = [r["first_step"] for r in recs if r.get("first_step") and len(r["first_step"]["p"]) == n]
    return Bias(len(recs), queries, hist, kl_from_uniform(hist), expected_kl_uniform(len(recs), n), tau, input_tau(recs),
                mean_by_position(f["p"] for f in firsts), mean_by_position(shares(f["s"]) for f in firsts))


def consistency_over_queries(records: Sequence[dict[str, Any]]) -> tuple[float, int]:
    """Mean over queries of the mean pairwise Kendall tau between the orders of a query's lists (records with
    ``qid`` and ``order``; queries with fewer than two lists are left out), and how many queries counted."""
    by_query: dict[str, list[Sequence[str]]] = {}
    for r in records:
        by_query.setdefault(r["qid"], []).append(r["order"])
    taus = [mean_pairwise_tau(orders) for orders in by_query.values() if len(orders) >= 2]
    return (mean(taus) if taus else float("nan")), len(taus)


def input_tau(records: Sequence[dict[str, Any]]) -> float:
    """Mean Kendall tau between each record's output order and its input order (1.0 = output copies
    the input order; for rank runs the input order is the first stage's)."""
    return mean([kendall_tau(r["order"], r["input"]) for r in records]) if records else float("nan")


def needle_ranks(store: Store, key: str) -> dict[str, dict[int, int]]:
    """``{qid: {position: rank of the needle}}`` (1-based both)."""
    out: dict[str, dict[int, int]] = {}
    for r in store.select("needle", key):
        out.setdefault(r["qid"], {})[int(r["position"])] = rank_of(r["order"], r["needle"])
    return out


def first_token_sweep(store: Store, key: str, alphas: Sequence[float], *, form: str = "additive",
                      kind: str = "rank") -> dict[float, list[dict[str, Any]]]:
    """Re-rank each stored first step offline with other calibration strengths: the first-token-capcal
    ranking is ``argsort`` of ``calibrate(p, q, alpha)``, a pure function of the stored ``p`` and ``q``
    (so a whole alpha curve costs no model call). Returns ``{alpha: rank-like records}``."""
    out: dict[float, list[dict[str, Any]]] = {a: [] for a in alphas}
    for r in store.select(kind, key):
        f = r.get("first_step")
        if not f or f.get("q") is None or len(f["candidates"]) != len(r["input"]):
            continue
        for a in alphas:
            out[a].append({"qid": r["qid"], "variant": r.get("variant", ""), "input": r["input"],
                           "order": [r["input"][f["candidates"][j]] for j in calibrated_order(f["p"], f["q"], a, form)]})
    return out


def slot_profile_consistency(store: Store, key: str, kind: str = "shuffle") -> tuple[float, int]:
    """The best any per-slot correction could do, label-free: rank each shuffled list's first step by
    ``log p - mean log p of that slot`` (the real prompt's own slot profile, averaged over every stored
    shuffle, instead of the empty prompt's estimate) and return the mean Kendall tau between a query's
    shuffles, with the number of queries. Near 0 = no content signal left once the slot is removed."""
    recs = [r for r in store.select(kind, key) if r.get("first_step") and len(r["first_step"]["p"]) == len(r["input"])]
    if not recs:
        return float("nan"), 0
    logs = [[math.log(max(x, 1e-12)) for x in r["first_step"]["p"]] for r in recs]
    profile = mean_by_position(logs)
    ranked = []
    for r, lp in zip(recs, logs):
        slots = [r["first_step"]["candidates"][j] for j in order_of_scores([x - profile[i] for i, x in enumerate(lp)])]
        ranked.append({"qid": r["qid"], "order": [r["input"][i] for i in slots]})
    return consistency_over_queries(ranked)


MEASURE_NAMES = (*MEASURES, CANDIDATES_NDCG)


def signal_split(store: Store, key: str = "vanilla") -> tuple[list[str], list[str], float] | None:
    """Split queries by how sure the model is, label-free: the normalised entropy ``H / log n`` of the
    real distribution at the first decoding step of method ``key``'s ranking. Returns (confident
    half, unsure half, median); ``None`` without such records."""
    ent = {}
    for r in store.select("rank", key):
        if r.get("entropies") and len(r["input"]) > 1:
            ent[r["qid"]] = r["entropies"][0] / math.log(len(r["input"]))
    if len(ent) < 2:
        return None
    median = statistics.median(ent.values())
    return ([q for q, h in ent.items() if h <= median], [q for q, h in ent.items() if h > median], median)


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """Probability that a random positive scores above a random negative (ties count half).

    >>> auc([0.9, 0.4], [0.5, 0.1]), auc([1.0], [1.0])
    (0.75, 0.5)
    """
    if not positive or not negative:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def content_auc(store: Store, key: str, grades: dict[str, dict[str, int]], rel: int, *, kind: str = "shuffle",
                field_: str = "p") -> tuple[float, int]:
    """How much content signal the first decoding step carries: per query, each passage's first-step
    probability (``field_`` "p", or "s" for the calibrated score) averaged over all of the query's lists
    of ``kind`` (over shuffles the slots average out), then the AUC of relevant (grade >= ``rel``)
    against judged non-relevant passages. Returns (mean AUC over queries, queries); 0.5 = no signal."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in store.select(kind, key):
        f = r.get("first_step")
        if not f or f.get(field_) is None or len(f["candidates"]) != len(r["input"]):
            continue
        for slot, value in zip(f["candidates"], f[field_], strict=True):
            sums.setdefault(r["qid"], {}).setdefault(r["input"][slot], []).append(value)
    aucs = []
    for qid, by_doc in sums.items():
        g = grades.get(qid, {})
        score = {d: math.fsum(v) / len(v) for d, v in by_doc.items()}
        value = auc([s for d, s in score.items() if g.get(d, 0) >= rel],
                    [s for d, s in score.items() if d in g and g[d] == 0])
        if not math.isnan(value):
            aucs.append(value)
    return (mean(aucs) if aucs else float("nan")), len(aucs)
