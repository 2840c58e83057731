"""The ``nulls`` part of ``python -m benchmarks.decisions``: the default rule under the nulls real models produce.

Every decision is the library's own sequential test (``rules.RULES["query"]``) over queries drawn at random from
DL19's BM25 lists, each read by the testbed's model (:mod:`capcal_integrations.testbed.model`) with the query and
again query-free; a :class:`Cell` per simulated model, its seeds derived from its own name. A query-free prompt loses
relevance (slope ``s``) but keeps the model's own preference (SD ``own``), which the query makes ``scale`` times as
sharp. :func:`null_cells` (``s = 0``: sharpened copies, query-shifted and censored priors, repeated queries, the shapes
of real traffic, relations that are no scaled copy), :func:`power_cells`, :func:`refused_cells` (readers a label-free
rule may not tell from a taste) and, not goals, :func:`beyond_cells`. Goals: false "reads" at most 1 % (exact 95 %
upper bound at most 1.5 %); "reads" within 24 queries at s = .5 and 12 at s = 1 in 95 % of runs; the refused readers
"does not read" in at most 5 %. ``--sweep`` decides every draw again by variants of the rule's test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import pathlib
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks import _common as C
from capcal_integrations.content_check import evidence, query_contrast, rules
from capcal_integrations.content_check.contrast import MIN_PASSAGES, Reading
from capcal_integrations.content_check.evidence import CAP
from capcal_integrations.testbed.model import SCENARIOS

RULE = rules.RULES["query"]
#: How many draws a repeated-query decision may make without a new query before it stops (the check then waits,
#: undecided, for a query it has not read).
EXHAUSTED = 200


@dataclass(frozen=True)
class Cell:
    name: str
    s: float = 0.0  # relevance slope
    shape: str = "fixed"
    own: float = 0.0  # SD of the model's own preference per passage
    scale: float = 1.0  # with the query, the own preference times this
    model: str = "no-delta"  # the testbed scenario (slot prior, noise shape)
    shift: float = 0.0  # SD of a per-query slot shift in the with-query prompts only
    shown: int = 0  # labels told apart per prompt (0: all)
    pool: int = 0  # distinct queries (0: every draw a new query)
    dedup: str = "query"  # the check reads a query once ("query") or a list once ("list")
    scale_sd: float = 0.0  # the scale drawn per query: scale * exp(N(0, scale_sd)) (lognormal)
    power: float = 1.0  # with the query, the own preference t becomes sign(t) |t|^power (then scaled)
    passage_sd: float = 0.0  # the scale drawn per passage too: times exp(N(0, passage_sd))
    weights_sd: float = 0.0  # with the query only, slot j's content times 1 + N(0, weights_sd) (per query)
    free_rel: float = 0.0  # the query-free prompt still shows this times the relevance (passages that look relevant)
    reverse: bool = False  # the given order reversed (worst first)

    def seed(self, base: int) -> int:
        fields = {k: v for k, v in asdict(self).items() if k not in _LATER or v != _LATER[k]}  # earlier cells' seeds kept
        text = json.dumps({**fields, "base": base}, sort_keys=True)
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "big")


_LATER = {"scale_sd": 0.0, "power": 1.0, "passage_sd": 0.0, "weights_sd": 0.0, "free_rel": 0.0, "reverse": False}
REAL_NULL = {"own": 0.5, "scale": 1.3}  # the real models' null: a sharper copy of a taste of their own


def null_cells(dedup: str = "query") -> list[Cell]:
    cells = [Cell(f"sharpened {scale:g}x, own SD {own:g}", own=own, scale=scale)
             for scale in (1.1, 1.3, 1.7) for own in (0.17, 0.5, 1.0)]
    cells.append(Cell("query-shifted slot prior, top-8 censored", own=1.0, shift=0.5, shown=8))
    cells += [Cell(f"repeated queries, pool of {p}", own=1.0, pool=p, dedup=dedup) for p in (3, 5, 10)]
    cells += [Cell("ties (top 8)", model="ties", **REAL_NULL), Cell("heavy tails", model="heavy-tails", **REAL_NULL),
              Cell("per-list noise scales", model="noise-scale-1", **REAL_NULL),
              Cell("shared slot effects", model="shared-slots", **REAL_NULL),
              Cell("mixed lengths", shape="mixed", **REAL_NULL), Cell("windows", shape="windows", **REAL_NULL),
              Cell("no content, no taste")]
    # relations between the with-query and the query-free preference that are no scaled copy within 0.8-2
    cells += [Cell(f"sharpened {scale:g}x, own SD {own:g}", own=own, scale=scale)
              for scale, owns in ((2.0, (0.17, 0.5, 1.0)), (2.2, (1.0,)), (2.5, (0.5, 1.0)), (3.0, (0.17, 0.5)),
                                  (0.5, (0.5, 1.0)), (0.7, (1.0,))) for own in owns]
    cells += [Cell("scale per query, lognormal (median 1.5, sdlog .5), own SD 1", own=1.0, scale=1.5, scale_sd=0.5),
              Cell("sharpened non-linearly, sign(t) |t|^1.5, own SD 1", own=1.0, power=1.5),
              *(Cell(f"scale per passage, lognormal (median 1.3, sdlog .3), own SD {own:g}", own=own, scale=1.3,
                     passage_sd=0.3) for own in (0.5, 1.0)),
              Cell("with-query slot weights 1 +- 1, own SD 1", own=1.0, weights_sd=1.0),
              Cell("query-shifted slot prior, top-8 censored, sharpened 2.5x", own=1.0, scale=2.5, shift=0.5, shown=8)]
    return cells


#: The null cells of the earlier suite (before the three outcomes): their names.
EARLIER = {c.name for c in null_cells()[:20]}


def power_cells() -> list[Cell]:
    return [Cell(f"{kind} reader, {shape}", s=s, shape=shape, **extra)
            for s in (0.5, 1.0) for shape in ("fixed", "mixed", "windows")
            for kind, extra in (("plain", {}), ("sharpened 1.3x own .5", REAL_NULL))]


def beyond_cells() -> list[Cell]:
    """Weak tastes sharpened near and past 3x, beside the null cell the taste gate over the scales 0.5-3 was made for
    (3x own SD .17): its neighbours inside that range (the gate's guarantee covers them), and copies sharper than 3x
    (where no guarantee holds: where the rule cannot know). Not goals; measured so that the docs can say how far the
    rule holds."""
    return [Cell(f"sharpened {scale:g}x, own SD {own:g}", own=own, scale=scale)
            for scale, own in ((2.5, 0.17), (3.0, 0.1), (3.0, 0.25), (3.0, 0.35), (3.5, 0.17), (4.0, 0.1), (4.0, 0.17),
                               (4.0, 0.3), (5.0, 0.1))]


def refused_cells() -> list[Cell]:
    """Readers a label-free rule may not tell from a taste of the model's own: "reads" or "cannot tell", never (in more
    than 5 % of runs) "does not read"."""
    return [Cell(f"reader whose query-free prompt shows .5x the relevance{extra}", s=s, free_rel=0.5, **kw)
            for s in (0.5, 1.0) for extra, kw in (("", {}), (", sharpened 1.3x own .5", REAL_NULL))] + \
           [Cell(f"reader, given order reversed{extra}", s=s, reverse=True, **kw)
            for s in (0.5, 1.0) for extra, kw in (("", {}), (", sharpened 1.3x own .5", REAL_NULL))]


def readings(cell: Cell, seed: int, all_grades: list[list[int]]):
    """The rule's reading (with the query, then query-free) of each query the check reads, in the order a decision
    draws them."""
    model = SCENARIOS[cell.model].replace(s=1.0, seed=seed)
    rng = random.Random(seed)
    pool = [rng.randrange(len(all_grades)) for _ in range(cell.pool)]
    seen: set = set()
    k = idle = 0
    while idle < EXHAUSTED:
        k += 1
        qid = rng.choice(pool) if pool else k
        grades = all_grades[qid] if pool else all_grades[rng.randrange(len(all_grades))]
        g = list_of(cell.shape, grades, random.Random(f"{seed}|{qid}") if pool else rng)
        if cell.reverse:
            g = g[::-1]
        n = len(g)
        keys = [f"p{qid}-{i}" for i in range(n)]
        changed = None
        if pool:  # the same query again with one passage changed (another passage, its own taste)
            j = rng.randrange(n)
            keys[j] = f"x{k}"
            changed = j, cell.own * rng.gauss(0.0, 1.0)
        ident = qid if cell.dedup == "query" else (qid, tuple(keys))
        if ident in seen or n < MIN_PASSAGES:
            idle += 1
            continue
        seen.add(ident)
        idle = 0
        # the tastes of a query the check reads (each passage's its own draw: a query skipped draws none)
        own = [cell.own * random.Random(f"{seed}|own|{key}").gauss(0.0, 1.0) for key in keys]
        if changed:
            own[changed[0]] = changed[1]
        tag = f"q{qid}" if pool else f"q{k}"  # a deterministic model: the same query, the same noise
        yield read_query(cell, model, seed, tag, g, keys, own)


def with_query_taste(cell: Cell, seed: int, tag: str, keys: list[str], own: list[float]) -> list[float]:
    """What the model's own preference becomes with the query: ``scale`` times it (a scale per query and per passage
    where the cell draws them), after ``sign(t) |t|^power``."""
    scale = cell.scale * (math.exp(cell.scale_sd * random.Random(f"{seed}|scale|{tag}").gauss(0.0, 1.0))
                          if cell.scale_sd else 1.0)
    each = random.Random(f"{seed}|each|{tag}")  # one draw per passage, in list order
    return [scale * (math.exp(cell.passage_sd * each.gauss(0.0, 1.0)) if cell.passage_sd else 1.0)
            * math.copysign(abs(t) ** cell.power, t) for t in own]


def read_query(cell: Cell, model, seed: int, tag: str, g: list[int], keys: list[str], own: list[float]) -> Reading:
    """One query's reading: its list in the rule's orders with the query, then query-free."""
    n = len(g)
    real = [cell.s * x + t for x, t in zip(g, with_query_taste(cell, seed, tag, keys, own))]
    free = [t + cell.free_rel * cell.s * x for x, t in zip(g, own)]
    orders = RULE.orders(n)
    weights = ([1.0 + cell.weights_sd * random.Random(f"{seed}|weight|{tag}|{j}").gauss(0.0, 1.0) for j in range(n)]
               if cell.weights_sd else None)
    with_query, free_read = (read(model, orders, keys, content, f"{tag} {kind}", key, w)
                             for content, kind, key, w in ((real, "with", tag, weights), (free, "free", f"{tag} free",
                                                                                           None)))
    if cell.shift:  # the query moves the slot prior: which labels a top-k server tells apart moves with it
        u = [cell.shift * random.Random(f"{seed}|shift|{tag}|{j}").gauss(0.0, 1.0) for j in range(n)]
        with_query = tuple(tuple(v + e for v, e in zip(vec, u)) for vec in with_query)
    if cell.shown:
        with_query, free_read = (tuple(censor(vec, cell.shown) for vec in vecs) for vecs in (with_query, free_read))
    return Reading((*with_query, *free_read))


def summaries(cell: Cell, seed: int, all_grades: list[list[int]]):
    """The rule's summary of each query the check reads, in the order a decision draws them."""
    for reading in readings(cell, seed, all_grades):
        yield RULE.summary(reading)


def read(model, orders: list[list[int]], keys: list[str], content: list[float], prompt: str, list_key: str,
         weights: list[float] | None = None) -> tuple:
    """The first-step label logits of ``content`` in each of ``orders`` (each order its own prompt: its own noise;
    slot ``j``'s content times ``weights[j]`` where given)."""
    w = weights or [1.0] * len(content)
    return tuple(tuple(model.logits([content[i] * w[j] for j, i in enumerate(o)], f"{prompt} r{r}",
                                    [keys[i] for i in o], list_key=list_key))
                 for r, o in enumerate(orders))


def censor(vec: tuple, shown: int) -> tuple:
    """All but the top ``shown`` labels tied at the lowest of them (what a top-k server returns)."""
    if len(vec) <= shown:
        return vec
    low = sorted(range(len(vec)), key=vec.__getitem__)[:len(vec) - shown]
    floor = min(vec[j] for j in low)
    return tuple(floor if j in low else v for j, v in enumerate(vec))


def decide(args: tuple) -> list[tuple[str, int]]:
    """``(verdict, queries)`` of one draw: the rule's own test first, then the same draw decided by each variant of it
    (``Evidence`` fields set otherwise, :func:`variant`) on the same queries, read once (common random numbers)."""
    cell, seed, grades, *rest = args
    tests = [RULE.evidence(CAP), *(variant(v) for v in (rest[0] if rest else ()))]
    stream = summaries(cell, seed, grades)
    for facts in stream:
        for test in tests:
            if test.verdict is None:
                test.add(*facts)
        if all(test.verdict is not None for test in tests):
            break
    # no query left that the check has not read: undecided where the test has no verdict yet
    return [(test.verdict or "undecided", test.queries) for test in tests]


def variant(fields: dict):
    """The rule's test with some of its :class:`~capcal_integrations.content_check.evidence.Evidence` fields set
    otherwise (``--sweep``)."""
    test = RULE.evidence(CAP)
    for name, value in fields.items():
        if not hasattr(test, name):
            raise SystemExit(f"--sweep: Evidence has no field {name!r}")
        setattr(test, name, value)
    return test


def counts(runs: list[tuple[str, int]]) -> dict:
    draws = len(runs)
    reads = [q for v, q in runs if v == "reads"]
    return {"reads": len(reads), "reads_rate": len(reads) / draws, "reads_upper_95": upper_bound(len(reads), draws),
            "does_not_read": sum(v == "does not read" for v, _ in runs), "undecided": sum(v == "undecided" for v, _ in runs),
            "cannot_tell": sum(v == "cannot tell" for v, _ in runs),
            "reads_within_12": sum(q <= 12 for q in reads) / draws, "reads_within_24": sum(q <= 24 for q in reads) / draws,
            "median_queries": sorted(q for _, q in runs)[draws // 2]}


def run_cell(pool, cell: Cell, draws: int, grades: list[list[int]], base: int, sweep: tuple[dict, ...] = ()) -> dict:
    start = time.perf_counter()
    seed0 = cell.seed(base)
    runs = pool.map(decide, [(cell, seed0 + d, grades, sweep) for d in range(draws)], chunksize=8)
    row = {**asdict(cell), "draws": draws, "seed": seed0, **counts([r[0] for r in runs]),
           "seconds": round(time.perf_counter() - start, 1)}
    if sweep:
        row["sweep"] = [{"fields": fields, **counts([r[i + 1] for r in runs])} for i, fields in enumerate(sweep)]
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def load_grades(data: str | pathlib.Path) -> list[list[int]]:
    """Per query, the grades of its BM25 candidates in first-stage order."""
    from capcal_integrations.evaluation.data import load_dataset

    ds = load_dataset(data)
    grades = ds.grades()
    return [[grades.get(t.qid, {}).get(c.docid, 0) for c in t.candidates] for t in ds.topics]


def list_of(shape: str, grades: list[int], rng: random.Random) -> list[int]:
    """The passages the check reads for one query of this shape (their grades, in first-stage order)."""
    if shape == "mixed":
        return grades[:rng.randint(3, 30)]
    return grades[:rng.randint(50, 100)][:20] if shape == "windows" else grades[:20]  # windows: the top of 50-100


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound of a binomial rate with ``k`` of ``n``."""
    from scipy.stats import beta  # the inverse of the binomial tail: a beta quantile
    return 1.0 if k >= n else float(beta.ppf(confidence, k + 1, n - k))


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    for kind, n in (("", 2000), ("power-", 400), ("refused-", 400), ("beyond-", 1000)):
        ap.add_argument(f"--{kind}draws", type=int, default=n, help=f"decisions per {kind.strip('-') or 'null'} cell")
    ap.add_argument("--earlier-draws", type=int, default=0, help="decisions per null cell of the earlier suite (0: "
                    "--draws): the rule's changes since can only lower their false \"reads\"")
    for flag, default in (("--workers", 2), ("--seed", 0)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--only", default="", help="run only the cells whose name contains this")
    ap.add_argument("--dedup", choices=("query", "list"), default="query", help="the repeated queries' check: per query")
    ap.add_argument("--scales", default="", help="the rule's scales instead of query_contrast.SCALES (comma list)")
    ap.add_argument("--sweep", default="", help="also decide every draw by variants of the rule's test on the same "
                    "queries: ';'-separated comma lists of Evidence fields after an optional 'label:'")
    ap.add_argument("--part", choices=("all", "earlier", "rest"), default="all", help="the earlier suite's 20 cells")


def run(a: argparse.Namespace, stamp: dict, save: Any) -> dict:
    """Every cell, ``save(run)`` after each (a run stopped early keeps what it finished, and says so)."""
    if a.scales:  # set before the pool forks
        query_contrast.SCALES = tuple(float(x) for x in a.scales.split(","))
    parts = [p for p in a.sweep.split(";") if p]
    sweep = tuple({k.strip(): float(v) for k, v in (f.split("=") for f in p.split(":")[-1].split(","))} for p in parts)
    labels = [p.split(":")[0].strip() if ":" in p else "" for p in parts]
    data = pathlib.Path(a.data) if a.data else C.need_data("trec-dl19-passage")
    grades = load_grades(data)[:2] if a.smoke else load_grades(data)
    wanted = lambda c, earlier=False: a.only in c.name and (a.part == "all" or (a.part == "earlier") == earlier)  # noqa: E731
    n = (4, 4, 4, 4, 4) if a.smoke else (a.draws, a.power_draws, a.refused_draws, a.earlier_draws or a.draws, a.beyond_draws)
    tasks = [("nulls", c, n[0]) for c in null_cells(a.dedup) if c.name not in EARLIER and wanted(c)]
    tasks += [("power", c, n[1]) for c in power_cells() if wanted(c)]
    tasks += [("refused", c, n[2]) for c in refused_cells() if wanted(c)]
    tasks += [("nulls", c, n[3]) for c in null_cells(a.dedup) if c.name in EARLIER and wanted(c, True)]
    tasks = [t for t in tasks + [("beyond", c, n[4]) for c in beyond_cells() if wanted(c)] if t[2] > 0]  # 0 draws: not run
    if not tasks:
        sys.exit(f"decisions nulls: no cell to run (--only {a.only!r}, the draws asked)")
    if a.smoke:  # one cell of each kind
        tasks = [next(t for t in tasks if t[0] == kind) for kind in ("nulls", "power", "refused", "beyond")]
    rows: dict[str, list[dict]] = {"nulls": [], "power": [], "refused": [], "beyond": []}
    order, start = {c.name: i for i, c in enumerate(null_cells(a.dedup))}, time.perf_counter()
    with multiprocessing.Pool(1 if a.smoke else a.workers) as pool:
        for done, (kind, cell, draws) in enumerate(tasks, 1):
            rows[kind].append(run_cell(pool, cell, draws, grades, a.seed, sweep))
            rows["nulls"].sort(key=lambda row: order.get(row["name"], len(order)))
            meta = {"sweep_labels": labels, "scales": list(query_contrast.SCALES), "rule": RULE.key,
                    "related_e": evidence.RELATED_E, "wide_e": evidence.WIDE_E, "partial": evidence.PARTIAL,
                    "partial_e": evidence.PARTIAL_E, "seconds": time.perf_counter() - start, "data": data.name,
                    "queries": len(grades), "cells_done": done, "cells": len(tasks)}
            result = null_run(a.name or ("nulls-smoke" if a.smoke else "nulls"), stamp, meta, **rows)
            save(result)
    return result


def null_run(name: str, stamp: dict, meta: dict, nulls: list[dict], power: list[dict], refused: list[dict],
             beyond: list[dict] = ()) -> dict:
    mark = lambda ok, why=" ✗": "" if ok else why  # noqa: E731
    outcomes = ["does not read", "cannot tell", "undecided", "median queries"]
    tables = [{"caption": "Without content (s = 0), false \"reads\": goal at most 1 %, the exact 95 % upper bound at most "
                          "1.5 % (\"(fewer draws)\": an earlier suite's cell re-run with fewer draws, whose bound only the "
                          "sample's size sets):",
               "columns": ["null", "shape", "decisions", "reads", "rate", "95 % upper", *outcomes],
               "rows": [[r["name"] + ("" if r["dedup"] == "query" else " (list de-duplication)"), r["shape"], r["draws"],
                         r["reads"], f"{100 * r['reads_rate']:.2f} %", f"{100 * r['reads_upper_95']:.2f} %" + mark(
                             r["reads_rate"] <= 0.01 and r["reads_upper_95"] <= 0.015, " (fewer draws)" if (
                                 r["name"] in EARLIER and r["draws"] < 2000 and not r["reads"]) else " ✗"),
                         r["does_not_read"], r.get("cannot_tell", 0), r["undecided"], r["median_queries"]] for r in nulls]},
              {"caption": "With content, \"reads\" within 12 and 24 queries: goal within 24 in at least 95 % of runs at "
                          "s = .5, within 12 at s = 1:",
               "columns": ["reader", "s", "decisions", "within 12", "within 24", "reads at all", "cannot tell",
                           "median queries"],
               "rows": [[r["name"], f"{r['s']:g}", r["draws"], f"{100 * r['reads_within_12']:.1f} %",
                         f"{100 * r['reads_within_24']:.1f} %" + mark(
                             (r["reads_within_12"] if r["s"] >= 1 else r["reads_within_24"]) >= 0.95),
                         f"{100 * r['reads'] / r['draws']:.1f} %", r.get("cannot_tell", 0), r["median_queries"]]
                        for r in power]},
              {"caption": "Readers a label-free rule may not tell from a taste: goal \"does not read\" in at most 5 % "
                          "(\"reads\" and \"cannot tell\" are both right answers):",
               "columns": ["reader", "s", "decisions", "reads", *outcomes],
               "rows": [[r["name"], f"{r['s']:g}", r["draws"], r["reads"],
                         f"{r['does_not_read']}" + mark(r["does_not_read"] <= 0.05 * r["draws"]), r.get("cannot_tell", 0),
                         r["undecided"], r["median_queries"]] for r in refused]}]
    if beyond:
        tables.append({"caption": "Near and past the wider range, not goals: weak tastes sharpened 2.5-5x (the taste "
                                  "gate's guarantee covers those inside the scales 0.5-3; past 3x no guarantee holds):",
                       "columns": ["null", "decisions", "reads", "rate", "95 % upper", *outcomes],
                       "rows": [[r["name"], r["draws"], r["reads"], f"{100 * r['reads_rate']:.2f} %",
                                 f"{100 * r['reads_upper_95']:.2f} %", r["does_not_read"], r["cannot_tell"],
                                 r["undecided"], r["median_queries"]] for r in beyond]})
    variants = [r["fields"] for r in (nulls + power + refused)[0].get("sweep", [])] if nulls + power + refused else []
    if variants:
        labels = meta.get("sweep_labels") or [""] * len(variants)
        names = ["the rule", *((f"{label}: " if label else "") + ", ".join(f"{k} {v:g}" for k, v in f.items())
                               for label, f in zip(labels, variants))]
        for caption, rows, show in (
                ("The rule's variants on the same draws (`--sweep`): false \"reads\" (95 % upper bound):",
                 [*nulls, *beyond], lambda x, s: f"{x['reads']} ({100 * x['reads_upper_95']:.2f} %)"),
                ("\"reads\" within 24 queries (s = .5) or 12 (s = 1):", power,
                 lambda x, s: f"{100 * (x['reads_within_12'] if s >= 1 else x['reads_within_24']):.1f} %"),
                ("The refused readers, \"does not read\" / \"reads\":", refused,
                 lambda x, s: f"{x['does_not_read']} / {x['reads']}")):
            tables.append({"caption": caption, "columns": ["cell", "decisions", *names],
                           "rows": [[r["name"] + (f", s = {r['s']:g}" if r["s"] else "") + (
                               (" (past 3x)" if r["scale"] > 3 else " (near)") if r in beyond else ""), r["draws"],
                                     *(show(x, r["s"]) for x in [r, *r["sweep"]])] for r in rows]})
    gates = (f"; the taste gate: an e-process on the relation against .95 at {meta.get('related_e', 10):g}, and the "
             f"product of the e-values over the scales 0.5-3 at {meta['wide_e']:g} or an e-process on the relation "
             f"against {meta['partial']:g} at {meta['partial_e']:g}; the rule's key `{meta.get('rule')}`"
             if "wide_e" in meta else "")
    stopped = (f" **Stopped early: {meta['cells_done']} of its {meta['cells']} cells ran.**"
               if meta.get("cells_done", 0) < meta.get("cells", 0) else "")
    return {"name": name, "stamp": stamp, "title": "The default rule under the nulls real models produce, and its power",
            "notes": [f"Data: {meta['data']} ({meta['queries']} queries); {meta['seconds']:.0f} s.{stopped} Each decision "
                      "is the library's own test (`rules.RULES[\"query\"]`: each query's e-value the least over the "
                      f"scales {min(meta['scales']):g}-{max(meta['scales']):g} of the sign-flip e-value of what the query "
                      f"adds beyond a scaled copy of the model's query-free preference{gates}; the with-query taste "
                      "that splits \"does not read\" from \"cannot tell\") over queries drawn at random, each cell with "
                      "seeds of its own. What each cell simulates: `benchmarks/_nulls.py`."],
            "tables": tables, "data": {"meta": meta, "nulls": nulls, "power": power, "refused": refused,
                                       "beyond": list(beyond)}}
