"""``report.md`` and its plots, from the stored records of one dataset."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any

from ..redaction import redact
from . import analysis as A
from . import diagnostics as D
from .data import Dataset, write_run
from .markdown import fmt, pvalue, table
from .specs import MethodSpec
from .store import Store

__all__ = ["write_report", "sections"]


def _vanilla(specs: Sequence[MethodSpec]) -> MethodSpec | None:
    """The baseline for the Δ columns: plain ``vanilla``, else the first vanilla variant listed."""
    return next((s for s in specs if s.key == "vanilla"), next((s for s in specs if s.method == "vanilla"), None))


def _quality_section(dataset: Dataset, store: Store, specs: Sequence[MethodSpec], img: pathlib.Path, prefix: str,
                     out: list[str]) -> A.Quality:
    runs = {s.label: list(store.select("rank", s.key)) for s in specs}
    baseline = _vanilla(specs)
    vanilla = baseline.label if baseline else None
    extra = {}
    for s in (s for s in specs if s.method == "vanilla"):  # PSC at no extra cost: Borda over the bias shuffles
        psc_free = A.borda_of_shuffles(store, s.key)
        if psc_free:
            extra[f"psc* (Borda of {s.label}'s {psc_free[0]['m']} bias shuffles)"] = psc_free
            break
    q = A.quality(dataset, {**{k: v for k, v in runs.items() if v}, **extra})
    if not q.per_query:
        out.append("_No reranking finished yet._\n")
        return q
    psc = next((s.label for s in specs if s.method == "psc" and s.label in q.per_query),
               next((label for label in extra if label in q.per_query), None))  # else PSC from the bias shuffles
    bm25 = next((s.label for s in specs if s.key == "bm25" and s.label in q.per_query), None)
    rows = []
    for label in q.per_query:
        qids = q.qids(label)
        row = [f"`{label}`", str(len(qids))] + [fmt(q.mean(label, m)) for m in A.MEASURE_NAMES]
        row.append(fmt(q.mean(bm25, "nDCG@10", qids)) if bm25 else "–")
        row.append(fmt(A.input_tau(runs[label]), 3) if runs.get(label) else "–")
        for base in (vanilla, psc):
            if base and base in q.per_query and label != base:
                t = q.test(label, base)
                row.append(f"{t.diff:+.4f} ({t.wins}/{t.ties}/{t.losses}; t {pvalue(t.t_p)}, perm {pvalue(t.perm_p)}; n={t.n})")
            else:
                row.append("–")
        rows.append(row)
    header = ["method", "queries", *A.MEASURE_NAMES, "bm25 nDCG@10 on the same queries", "τ(output, BM25 order)",
              "Δ nDCG@10 vs vanilla (W/T/L; p)", "Δ nDCG@10 vs psc (W/T/L; p)"]
    out += [table(header, rows), ""]
    out.append("Δ: mean paired difference on the queries both methods finished; W/T/L = queries better/equal/worse; "
               "p-values: two-sided paired t-test and sign-flip permutation test. R@20 cannot change when only the "
               "top-20 is reranked (it is the first stage's). `psc*` is Borda over stored shuffles, not the engine's "
               "`psc` (which uses its own seed's shuffles): same method, different random orders.\n")
    from . import plots

    plots.quality_plot({k: v["nDCG@10"] for k, v in q.per_query.items()}, img / "ndcg_per_method.png")
    out.append(f"![nDCG@10 per method]({prefix}ndcg_per_method.png)\n")
    if vanilla and vanilla in q.per_query:
        deltas = {}
        for label in q.per_query:
            if label != vanilla and not label.startswith("psc*") and label != bm25:
                a, b = q.per_query[label]["nDCG@10"], q.per_query[vanilla]["nDCG@10"]
                deltas[label] = {k: a[k] - b[k] for k in a if k in b}
        if deltas:
            plots.delta_plot(deltas, img / "delta_vs_vanilla.png")
            out.append("Per-query picture (difference to vanilla, sorted):\n\n"
                       f"![per-query Δ]({prefix}delta_vs_vanilla.png)\n")
    return q


def _bias_section(dataset: Dataset, store: Store, specs: Sequence[MethodSpec], n: int, img: pathlib.Path, prefix: str,
                  out: list[str]) -> None:
    found = {s.label: (s, b) for s in specs if (b := A.bias(store, s.key, n)) is not None}
    by_query = {r["qid"]: r["prior"] for s in specs if s.calibrated and s.options.get("placeholder") is None
                for r in store.select("rank", s.key) if r.get("prior") and len(r["prior"]) == n}
    priors = list(by_query.values())  # one per query: every calibrated method sees the same empty prompt
    prior = A.mean_by_position(priors) if priors else None
    if prior:
        mid = prior[n // 4: n - n // 4]
        out.append(f"**Empty-prompt prior** (first step, mean over {len(priors)} queries, default placeholder): "
                   f"P([1]) = {prior[0]:.3f}, P([{n}]) = {prior[-1]:.3f}, middle slots {n // 4 + 1}..{n - n // 4} "
                   f"mean {sum(mid) / len(mid):.3f} (uniform = {1 / n:.3f}).\n")
    if not found:
        out.append("_No shuffle runs yet._\n")
        return
    rows = []
    for label, (spec, b) in found.items():
        total = sum(b.histogram) or 1
        ndcg, _ = A.shuffled_quality(dataset, store, spec.key)
        rows.append([f"`{label}`", str(b.lists), str(b.queries), fmt(b.histogram[0] / total, 2),
                     fmt(b.histogram[-1] / total, 2), f"{b.kl:.3f} ({b.kl_noise:.3f})", fmt(b.tau, 3),
                     fmt(b.tau_input, 3), fmt(ndcg)])
    first, first_bias = next(iter(found.values()))
    random_ndcg, _ = A.shuffled_quality(dataset, store, first.key, input_order=True)
    rows.append(["the shuffled input order itself (random)", str(first_bias.lists), str(first_bias.queries),
                 *["–"] * 5, fmt(random_ndcg)])
    out += [table(["method", "lists", "queries", "top-1 from slot 1", f"top-1 from slot {n}",
                   "KL(top-1 slot ‖ uniform) (noise floor)", "mean Kendall τ between shuffles",
                   "τ(output, input order)", "nDCG@10 on shuffled lists"], rows), ""]
    out.append(f"Each list is a fixed random shuffle of a query's top-{n}. The noise floor is the KL that a ranker "
               "with no position preference would show with this many lists (simulated). τ between shuffles = 1 means "
               "the ranking does not depend on the input order; τ(output, input order) near 1 means the model copies "
               "the list in the order it was given. nDCG@10 on shuffled lists: quality when the input order carries no "
               "first-stage signal (mean over a query's shuffles, then over queries).\n")
    from . import plots

    firsts = {label: (b.first_s if spec.calibrated else b.first_p) for label, (spec, b) in found.items() if b.first_p}
    histograms = {label: b.histogram for label, (_, b) in found.items() if label != "bm25"}
    plots.top1_plot(histograms, firsts, prior, img / "top1_positions.png")
    out.append(f"![top-1 positions]({prefix}top1_positions.png)\n")


def _needle_section(store: Store, specs: Sequence[MethodSpec], n: int, img: pathlib.Path, prefix: str,
                    out: list[str]) -> None:
    found = {s.label: r for s in specs if (r := A.needle_ranks(store, s.key))}
    if not found:
        out.append("_No needle runs yet._\n")
        return
    positions = sorted({p for r in found.values() for per in r.values() for p in per})
    rows = []
    for label, by_query in found.items():
        means = []
        for p in positions:
            vals = [per[p] for per in by_query.values() if p in per]
            means.append(sum(vals) / len(vals) if vals else float("nan"))
        ok = [m for m in means if not math.isnan(m)]
        rows.append([f"`{label}`", str(len(by_query))] + [fmt(m, 1) for m in means]
                    + [fmt(sum(ok) / len(ok), 2), fmt(max(ok) - min(ok), 1)])
    out += [table(["method", "queries", *[f"@{p}" for p in positions], "mean rank", "range"], rows), ""]
    from . import plots

    plots.needle_plot(found, img / "needle.png", n)
    out.append("Rank (1 = top) of one relevant passage placed among judged non-relevant passages of the same "
               f"query, by its input position.\n\n![needle]({prefix}needle.png)\n")


def _cost_section(store: Store, specs: Sequence[MethodSpec], q: A.Quality, img: pathlib.Path, prefix: str,
                  out: list[str]) -> None:
    costs = {s.label: c for s in specs if s.uses_model and (c := A.cost(store, s.key)) is not None}
    if not costs:
        return
    van = _vanilla(specs)
    rows = []
    for s in specs:
        c = costs.get(s.label)
        if c is None:
            continue
        ratio = "–"
        if van and van.label in costs:
            common = [r["qid"] for r in store.select("rank", s.key)]
            v = A.cost(store, van.key, common)
            mine = A.cost(store, s.key, [r["qid"] for r in store.select("rank", van.key)])
            if v and mine and v.median_standalone > 0:
                ratio = (f"{mine.median_standalone / v.median_standalone:.2f}× time (est. standalone), "
                         f"{mine.requests / max(v.requests, 1e-9):.2f}× requests")
        rows.append([f"`{s.label}`", str(c.n), fmt(c.requests, 1), fmt(c.prompt_tokens, 0), fmt(c.uncached_tokens, 0),
                     fmt(c.completion_tokens, 1), fmt(c.seconds, 1), fmt(c.median_seconds, 1),
                     fmt(c.median_standalone, 1), ratio])
    out += [table(["method", "rankings", "HTTP requests", "prompt tokens", "uncached prompt tokens",
                   "completion tokens", "mean s", "median s", "median s, est. standalone",
                   "vs vanilla (same queries)"], rows), ""]
    out.append("Means per query. Methods ran back to back per query in the listed order, so the first model method "
               "pays the cold prompt (prefill of the ~2k-token list) that later ones find in the server's prompt "
               "cache; uncached prompt tokens show who paid it. The standalone estimate charges a method that found the "
               "real prompt warm with `first-token`'s time on that list (one cold prefill), and a calibrated one also "
               "with `first-token:capcal`'s (the empty prompt's prefill); the plot and the ratio use it.\n")
    points = {label: (c.median_standalone, q.mean(label)) for label, c in costs.items() if label in q.per_query}
    if points:
        from . import plots

        plots.cost_plot(points, img / "cost_quality.png", "median seconds per query (estimated standalone)")
        out.append(f"![cost vs quality]({prefix}cost_quality.png)\n")


def sections(dataset: Dataset, store: Store, specs: Sequence[MethodSpec], biased: Sequence[MethodSpec],
             img: pathlib.Path, prefix: str = "", top: int = 20) -> str:
    """The report body (markdown; images written to ``img``, linked as ``prefix + name``)."""
    img.mkdir(parents=True, exist_ok=True)
    out: list[str] = ["### Quality\n"]
    q = _quality_section(dataset, store, specs, img, prefix, out)
    if A.signal_split(store) is not None:
        out.append("### Where the model has signal\n")
        D.signal_section(store, q, out)
    out.append("### Position bias\n")
    _bias_section(dataset, store, biased, top, img, prefix, out)
    if any(True for s in biased for r in store.select("shuffle", s.key) if r.get("first_step")):
        out.append("### Content signal at the first step\n")
        D.content_section(dataset, store, biased, out)
    out.append("### Needle test\n")
    _needle_section(store, biased, top, img, prefix, out)
    out.append("### Cost\n")
    _cost_section(store, specs, q, img, prefix, out)
    if any(True for _ in store.select("rank", "first-token-capcal")):
        out.append("### Calibration strength, offline (first-token-capcal)\n")
        D.sweep_section(dataset, store, out)
    return "\n".join(out)


def write_report(out: pathlib.Path, dataset: Dataset, store: Store, specs: Sequence[MethodSpec],
                 biased: Sequence[MethodSpec], meta: dict[str, Any]) -> pathlib.Path:
    """Write one run file per method, the plots and ``report.md`` into ``out``."""
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for s in specs:
        recs = list(store.select("rank", s.key))
        if recs:
            write_run(runs / f"{s.key.replace(':', '_').replace(',', '_').replace('=', '-')}.txt",
                      A.run_for(dataset, recs), s.key)
    head = [f"# capcal eval: {dataset.name}\n",
            f"- queries: {len(dataset.topics)} (top-{meta.get('top', 20)} of the first stage reranked)",
            f"- model: `{meta.get('model_id') or meta.get('model', '?')}` on "
            f"{meta.get('server') or 'an OpenAI-compatible server'}"
            + (f", weights `{meta['weights']}`" if meta.get("weights") else "")
            + (f" (xllamacpp {meta['xllamacpp']})" if meta.get("xllamacpp") else ""),
            f"- command: `{redact(meta.get('command', ''))}`",
            f"- finished: {meta.get('finished', 'not yet')}\n"]
    body = sections(dataset, store, specs, biased, out, "", int(meta.get("top", 20)))
    path = out / "report.md"
    path.write_text("\n".join(head) + "\n" + body + "\n")
    return path
