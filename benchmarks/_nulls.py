"""The ``nulls`` part of ``python -m benchmarks.decisions``: the default rule under the nulls real models produce.

Every decision is the library's own sequential test (``rules.RULES["query"]``: its orders, its per-query e-value
:func:`~capcal_integrations.content_check.query_contrast.judge_scaled`, its
:class:`~capcal_integrations.content_check.evidence.Evidence`) over queries drawn at random from DL19's BM25 lists, each
read by the testbed's model (:mod:`capcal_integrations.testbed.model`) with the query and again query-free. A cell is
a :class:`Cell`, its seeds derived from its own name. A query-free prompt loses relevance (slope ``s``) but keeps the
model's own preference (SD ``own``, per passage), which the query makes ``scale`` times as sharp. The nulls (``s =
0``, :func:`null_cells`): sharpened copies (``scale`` 1.1-1.7 x ``own`` .17-1; the packaged models: 1.31 and 1.67); a
query-shifted slot prior with the labels below the top 8 tied (a hosted top-k); pools of 3-10 queries asked again with
one passage changed (the check reads a query once; ``--dedup list``: whenever its list differs); the shapes of real
traffic under the real models' null (ties, heavy tails, per-list noise scales, shared slot effects, mixed lengths,
sliding windows); and relations that are no scaled copy within the rule's range (scales 2-3 and .5-.7, per query, per
passage, non-linear, slot weights with the query only). The power cells (``s`` = .5 and 1): a plain and a sharpened
reader in every shape. The refused readers (:func:`refused_cells`): the query-free prompt still shows .5x the
relevance, or the given order reversed. Goals: false "reads" at most 1 % with the exact 95 % upper bound at most
1.5 %; "reads" within 24 queries at s = .5 and within 12 at s = 1 in at least 95 % of runs; the refused readers
"does not read" in at most 5 %.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import multiprocessing
import pathlib
import random
import sys
import time
from dataclasses import asdict, dataclass

from benchmarks import _common as C
from capcal_integrations.content_check import query_contrast, rules
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
    root = pathlib.Path(data)
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels.txt").read_text().splitlines():
        qid, _, doc, grade = line.split()
        qrels.setdefault(qid, {})[doc] = int(grade)
    with gzip.open(root / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        topics = [json.loads(line) for line in f]
    return [[qrels.get(t["qid"], {}).get(c["docid"], 0) for c in t["candidates"]] for t in topics]


def list_of(shape: str, grades: list[int], rng: random.Random) -> list[int]:
    """The passages the check reads for one query of this shape (their grades, in first-stage order)."""
    if shape == "mixed":
        return grades[:rng.randint(3, 30)]
    if shape == "windows":
        return grades[:rng.randint(50, 100)][:20]  # the top window of a 50-100 candidate list
    return grades[:20]


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The exact (Clopper-Pearson) one-sided upper bound of a binomial rate with ``k`` of ``n``."""
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lp, lq = math.log(mid), math.log1p(-mid)  # the terms in log space: any n and k (no float overflow)
        cdf = math.fsum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
                        for i in range(k + 1))
        lo, hi = (mid, hi) if cdf > 1 - confidence else (lo, mid)
    return hi


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    ap.add_argument("--draws", type=int, default=2000, help="decisions per null cell")
    ap.add_argument("--power-draws", type=int, default=400, help="decisions per power cell")
    ap.add_argument("--refused-draws", type=int, default=400, help="decisions per refused-reader cell")
    ap.add_argument("--earlier-draws", type=int, default=0, help="decisions per null cell of the earlier suite (0: "
                    "--draws): the rule's changes since can only lower their false \"reads\"")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="run only the cells whose name contains this")
    ap.add_argument("--dedup", choices=("query", "list"), default="query", help="how the repeated-query cells' check "
                    "tells queries apart")
    ap.add_argument("--scales", default="", help="the rule's scales instead of query_contrast.SCALES (comma list)")
    ap.add_argument("--sweep", default="", help="also decide every draw by variants of the rule's test on the same "
                    "queries: ';'-separated comma lists of Evidence fields, e.g. 'related_e=30;related_e=100'")


def run(a: argparse.Namespace, stamp: dict) -> dict:
    if a.scales:  # set before the pool forks
        query_contrast.SCALES = tuple(float(x) for x in a.scales.split(","))
    sweep = tuple({k: float(v) for k, v in (f.split("=") for f in part.split(",")) if k} for part in a.sweep.split(";") if part)
    data = pathlib.Path(a.data) if a.data else C.need_data("trec-dl19-passage")
    grades = load_grades(data)[:2] if a.smoke else load_grades(data)
    draws = (4, 4, 4) if a.smoke else (a.draws, a.power_draws, a.refused_draws)
    pick = (lambda cells: cells[:1]) if a.smoke else (lambda cells: [c for c in cells if a.only in c.name])
    start = time.perf_counter()
    with multiprocessing.Pool(1 if a.smoke else a.workers) as pool:
        nulls = [run_cell(pool, c, draws[0] if c.name not in EARLIER or not a.earlier_draws else a.earlier_draws,
                          grades, a.seed, sweep) for c in pick(null_cells(a.dedup))]
        power = [run_cell(pool, c, draws[1], grades, a.seed, sweep) for c in pick(power_cells())]
        refused = [run_cell(pool, c, draws[2], grades, a.seed, sweep) for c in pick(refused_cells())]
    meta = {"scales": list(query_contrast.SCALES), "seconds": time.perf_counter() - start, "data": data.name,
            "queries": len(grades)}
    return null_run(a.name or ("nulls-smoke" if a.smoke else "nulls"), stamp, meta, nulls, power, refused)


def null_run(name: str, stamp: dict, meta: dict, nulls: list[dict], power: list[dict], refused: list[dict]) -> dict:
    mark = lambda ok, why=" ✗": "" if ok else why  # noqa: E731
    tables = [{"caption": "Without content (s = 0), false \"reads\": goal at most 1 %, the exact 95 % upper bound at most "
                          "1.5 % (\"(fewer draws)\": an earlier suite's cell, re-run with fewer draws, whose bound only "
                          "the sample's size sets):",
               "columns": ["null", "shape", "decisions", "reads", "rate", "95 % upper", "does not read", "cannot tell",
                           "undecided", "median queries"],
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
               "columns": ["reader", "s", "decisions", "reads", "cannot tell", "does not read", "undecided",
                           "median queries"],
               "rows": [[r["name"], f"{r['s']:g}", r["draws"], r["reads"], r.get("cannot_tell", 0),
                         f"{r['does_not_read']}" + mark(r["does_not_read"] <= 0.05 * r["draws"]), r["undecided"],
                         r["median_queries"]] for r in refused]}]
    variants = [r["fields"] for r in (nulls + power + refused)[0].get("sweep", [])] if nulls + power + refused else []
    if variants:
        names = ["the rule", *(", ".join(f"{k} {v:g}" for k, v in f.items()) for f in variants)]
        for caption, rows, show in (
                ("The rule's variants on the same draws (`--sweep`): false \"reads\" (95 % upper bound):", nulls,
                 lambda x, s: f"{x['reads']} ({100 * x['reads_upper_95']:.2f} %)"),
                ("\"reads\" within 24 queries (s = .5) or 12 (s = 1):", power,
                 lambda x, s: f"{100 * (x['reads_within_12'] if s >= 1 else x['reads_within_24']):.1f} %"),
                ("The refused readers, \"does not read\" / \"reads\":", refused,
                 lambda x, s: f"{x['does_not_read']} / {x['reads']}")):
            tables.append({"caption": caption, "columns": ["cell", "decisions", *names],
                           "rows": [[r["name"] + (f", s = {r['s']:g}" if r["s"] else ""), r["draws"],
                                     *(show(x, r["s"]) for x in [r, *r["sweep"]])] for r in rows]})
    return {"name": name, "stamp": stamp, "title": "The default rule under the nulls real models produce, and its power",
            "notes": [f"Data: {meta['data']} ({meta['queries']} queries); {meta['seconds']:.0f} s. Each decision is the "
                      "library's own test (`rules.RULES[\"query\"]`: each query's e-value the least over the scales "
                      f"{min(meta['scales']):g}-{max(meta['scales']):g} of the sign-flip e-value of what the query adds "
                      "beyond a scaled copy of the model's query-free preference; the taste gate on \"reads\"; the "
                      "with-query taste that splits \"does not read\" from \"cannot tell\") over queries drawn at random, "
                      "each cell with seeds of its own. What each cell simulates: `benchmarks/_nulls.py`."],
            "tables": tables, "data": {"meta": meta, "nulls": nulls, "power": power, "refused": refused}}
