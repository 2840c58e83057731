"""The content check's decisions on the testbed: how often it says "reads" without content, and how fast with it.

Each decision is the library's own sequential test (``capcal_integrations.content_check.contrast``: four first-step
readings per query, the agreement score, the two e-processes, the cap) run over queries drawn at random
from a real collection's BM25 lists (relevance grades from its qrels), each query read by the testbed's
model (``capcal_integrations.testbed.model``, the same formula the simulated endpoint serves) with fresh
noise. Shapes of traffic:

* ``fixed``: every query's top 20;
* ``mixed``: each query cut to a length drawn from 3..30 (lists shorter than 4 are not read: they neither
  decide nor count);
* ``windows``: lists of 50-100 candidates ranked by sliding windows; the check reads each query's top window
  once (the first 20), never its other windows.

Null scenarios (``s = 0``: no content) give the false-"reads" rate with its exact 95 % upper bound
(Clopper-Pearson); ``s > 0`` gives the share of decisions that say "reads" within 12 and 24 queries. One
command writes ``benchmarks/results/decisions.md`` and ``.json``::

    python benchmarks/decisions.py --data ../shared/data/trec-dl19-passage --draws 2000

``--rule query`` runs the default rule ``guard="query"`` (``capcal_integrations/content_check/query_contrast.py``) instead:
each query's list is read in the rule's orders (four; six below ten slot pairs) with the query and again query-free
(eight or twelve readings, the query-free prompts with their own noise, the list's shared slot effects the same in
all), and the test runs
on what the query adds. What a query-free prompt shows the testbed's model: a relevance reader's grades become 0
(no query to be relevant to, as the testbed's server reads a query-free prompt); a reader of its own keeps its
preferences (they do not depend on the query); the first-stage follower (:data:`FOLLOWER`) loses its preference
(query-dependent, like lexical matching), the rank proxy (:data:`RANK_PROXY`) keeps it (a passage property that
correlates with the first stage's rank). ``--sweep`` also decides every draw at other ``align_e`` values (the same
readings: common random numbers). Writes ``benchmarks/results/decisions-query.md`` and ``.json``::

    python benchmarks/decisions.py --rule query --followers --sweep 0,2,5,20 --workers 1

The real packaged models' readings are analysed by ``benchmarks/testbed.py --real`` (their decisions).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import pathlib
import random
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.content_check import rules  # noqa: E402
from capcal_integrations.content_check.contrast import MIN_PASSAGES, Reading  # noqa: E402
from capcal_integrations.content_check.evidence import ALIGN_E, CAP, Evidence  # noqa: E402
from capcal_integrations.testbed.model import SCENARIOS  # noqa: E402

NULL_SCENARIOS = ("no-delta", "ties", "heavy-tails", "noise-scale-0.5", "noise-scale-1", "scale-1.5b", "shared-slots",
                  "delta-0.5b", "delta-1.5b", "last-digit")
SHAPES = ("fixed", "mixed", "windows")
#: Readers of their own: content read consistently that follows neither relevance nor the first stage (what the
#: packaged 0.5B and 1.5B do on DL19); "reads" is a wrong call for them too.
OWN = "own-preferences"
#: A first-stage follower: content read consistently that is a noisy copy of the first stage's order and carries
#: no relevance information beyond it. The passage at first-stage rank ``i`` of the ``n`` read has the preference
#: ``-beta * i / n + N(0, sigma)``, read at slope ``s`` (``benchmarks/tradeoff.py`` sets ``beta`` and ``sigma`` so
#: that at s = .5 its per-query agreement and alignment means match a relevance reader's at s = .5).
FOLLOWER = "first-stage-follower"
#: The follower's ``(beta, sigma)`` unless given (what ``benchmarks/tradeoff.py`` calibrated on DL19's top 20).
FOLLOWER_SHAPE = (0.574, 0.635)
#: The follower's preference as a property of the passage alone (its length, say, where length correlates with the
#: first stage's rank): the same preference as :data:`FOLLOWER`, but the same with and without the query. The
#: content rule cannot tell the two apart; the query rule (``--rule query``) reads the query-free prompts.
RANK_PROXY = "rank-proxy"
#: A reader of its own whose preferences need the query (random per passage as :data:`OWN`'s, gone without the
#: query): for the query rule, a query effect that follows neither relevance nor the first stage, what its
#: alignment evidence (``align_e``) is for. The content rule reads it as :data:`OWN`.
OWN_QUERY = "query-own-preferences"
#: The content rules this benchmark runs (``capcal_integrations.content_check.rules.RULES``).
RULE_NAMES = ("content", "query")


def default_align_e(rule: str = "content") -> float:
    """The alignment e-value the rule's "reads" needs (the content rule's :data:`ALIGN_E`, the query rule's
    ``rules.QUERY_ALIGN_E``)."""
    return rules.rule_named(rule).evidence(CAP).align_e


def load_judged(data: str) -> tuple[list[list[int]], list[list[int]]]:
    """Per query, the grades of its BM25 candidates in first-stage order, and all of its judgements (nDCG's ideal)."""
    import gzip

    root = pathlib.Path(data)
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels.txt").read_text().splitlines():
        qid, _, doc, grade = line.split()
        qrels.setdefault(qid, {})[doc] = int(grade)
    with gzip.open(root / "candidates.jsonl.gz", "rt", encoding="utf-8") as f:
        topics = [json.loads(line) for line in f]
    grades = [[qrels.get(t["qid"], {}).get(c["docid"], 0) for c in t["candidates"]] for t in topics]
    return grades, [sorted(qrels.get(t["qid"], {}).values(), reverse=True) for t in topics]


def load_grades(data: str) -> list[list[int]]:
    """Per query, the grades of its BM25 candidates in first-stage order."""
    return load_judged(data)[0]


def list_of(shape: str, grades: list[int], rng: random.Random) -> list[int]:
    """The passages the check reads for one query of this shape (their grades, in first-stage order)."""
    if shape == "mixed":
        return grades[:rng.randint(3, 30)]
    if shape == "windows":
        return grades[:rng.randint(50, 100)][:20]  # the top window of a 50-100 candidate list
    return grades[:20]


def query_summaries(scenario: str, s: float, shape: str, seed: int, all_grades: list[list[int]],
                    follower: tuple[float, float] = FOLLOWER_SHAPE, rule: str = "content"):
    """The rule's ``summary()`` of each query the check reads, in the order a decision draws them (endless). With
    ``rule="query"`` each list is read in the rule's orders with the query, then query-free (module docstring: what
    the model reads without the query)."""
    own = scenario in (OWN, OWN_QUERY)  # content of the model's own: a random preference per passage, not the grades
    follows = scenario in (FOLLOWER, RANK_PROXY)  # a noisy copy of the first stage's order (FOLLOWER)
    free_same = scenario in (OWN, RANK_PROXY)  # the preference is the same without the query
    summarise, orders = rules.rule_named(rule).summary, rules.rule_named(rule).orders
    query_free = rules.rule_named(rule).query_free
    model = SCENARIOS["no-delta" if own or follows else scenario].replace(s=s, seed=seed)
    rng = random.Random(seed)
    k = 0
    while True:
        g = list_of(shape, all_grades[rng.randrange(len(all_grades))], rng)
        if own:
            g = [rng.gauss(1.0, 1.0) for _ in g]
        elif follows:
            beta, sigma = follower
            g = [-beta * i / len(g) + rng.gauss(0.0, sigma) for i in range(len(g))]
        k += 1
        n = len(g)
        if n < MIN_PASSAGES:
            continue
        keys = [f"p{k}-{i}" for i in range(n)]
        slots = tuple(tuple(model.logits([g[i] for i in order], f"q{k} r{r}", [keys[i] for i in order], list_key=f"q{k}"))
                      for r, order in enumerate(orders(n)))
        if query_free:  # the same orders, the query replaced: other prompts (fresh noise), the same list
            free = g if free_same else [0.0] * n
            slots += tuple(tuple(model.logits([free[i] for i in order], f"q{k} free r{r}", [keys[i] for i in order],
                                              list_key=f"q{k}"))
                           for r, order in enumerate(orders(n)))
        yield summarise(Reading(slots))


#: ``--lambdas``: the agreement e-processes' betting fractions instead of the rule's (set before the pool forks).
LAMBDAS_OVERRIDE: tuple[float, ...] = ()
#: ``--bet-pairs``: the agreement bets' size by list length instead of the rule's (``Evidence.bet_pairs``).
BET_PAIRS_OVERRIDE: int | None = None


def one_decision(args: tuple) -> tuple[str, int]:
    """One decision: ``args`` is ``(scenario, s, shape, seed, all_grades)``, optionally followed by ``align_e`` (the
    alignment e-value "reads" needs; default the rule's: :func:`default_align_e`), the follower's ``(beta, sigma)``
    (:data:`FOLLOWER`) and the rule's name (default ``"content"``)."""
    return sweep_decision(args)[0]


def sweep_decision(args: tuple, align_es: tuple[float, ...] = ()) -> list[tuple[str, int]]:
    """``one_decision(args)``, then the same draw decided at each of ``align_es`` (the same queries, read once)."""
    scenario, s, shape, seed, all_grades, *rest = args
    rule = rest[2] if len(rest) > 2 and rest[2] is not None else "content"
    align_e = rest[0] if len(rest) > 0 and rest[0] is not None else default_align_e(rule)
    follower = rest[1] if len(rest) > 1 and rest[1] is not None else FOLLOWER_SHAPE
    stream = query_summaries(scenario, s, shape, seed, all_grades, follower, rule)
    seen: list[tuple[float, float, int]] = []
    out = []
    own = rules.rule_named(rule).evidence(CAP)  # the rule's own test: betting fractions, their size by list length
    lambdas = LAMBDAS_OVERRIDE or own.lambdas
    bet_pairs = own.bet_pairs if BET_PAIRS_OVERRIDE is None else BET_PAIRS_OVERRIDE
    for e in (align_e, *align_es):
        # a fresh test per align_e (no state shared)
        evidence = Evidence(cap=CAP, align_e=e, lambdas=lambdas, bet_pairs=bet_pairs)
        i = 0
        while evidence.verdict is None:
            if i == len(seen):
                seen.append(next(stream))
            evidence.add(*seen[i])
            i += 1
        out.append((evidence.verdict, evidence.queries))
    return out


def _sweep_task(args: tuple) -> list[tuple[str, int]]:
    *decision, align_es = args
    return sweep_decision(tuple(decision), align_es)


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


def _stats(runs: list[tuple[str, int]]) -> dict:
    draws = len(runs)
    verdicts = [v for v, _ in runs]
    reads = [q for v, q in runs if v == "reads"]
    return {"reads": len(reads), "does_not_read": verdicts.count("does not read"), "undecided": verdicts.count("undecided"),
            "reads_within_12": sum(q <= 12 for q in reads) / draws, "reads_within_24": sum(q <= 24 for q in reads) / draws,
            "median_queries": sorted(q for _, q in runs)[draws // 2], "reads_rate": len(reads) / draws,
            "reads_upper_95": upper_bound(len(reads), draws)}


def cell(pool, scenario: str, s: float, shape: str, draws: int, grades: list[list[int]], seed: int,
         rule: str = "content", align_e: float | None = None, sweep: tuple[float, ...] = ()) -> dict:
    start = time.perf_counter()
    align_e = default_align_e(rule) if align_e is None else align_e
    tasks = [(scenario, s, shape, seed * 100_003 + d, grades, align_e, None, rule, sweep) for d in range(draws)]
    runs = pool.map(_sweep_task, tasks, chunksize=8)
    main = _stats([r[0] for r in runs])
    out = {"scenario": scenario, "s": s, "shape": shape, "draws": draws, "rule": rule, "align_e": align_e,
           **{k: main[k] for k in ("reads", "does_not_read", "undecided", "reads_within_12", "reads_within_24",
                                   "median_queries")},
           "seconds": round(time.perf_counter() - start, 1), "reads_rate": main["reads_rate"],
           "reads_upper_95": main["reads_upper_95"]}
    if sweep:
        out["by_align_e"] = {f"{e:g}": _stats([r[1 + i] for r in runs]) for i, e in enumerate(sweep)}
    print(json.dumps(out), flush=True)
    return out


CONSISTENT = (OWN, OWN_QUERY, FOLLOWER, RANK_PROXY)  # content read consistently, not for relevance: their own sections


def report(rows: list[dict], meta: dict) -> str:
    rule = meta.get("rule", "content")
    align_e = meta.get("align_e", ALIGN_E)
    nulls = [r for r in rows if r["s"] == 0 and r["scenario"] not in CONSISTENT]
    power = [r for r in rows if r["s"] > 0 and r["scenario"] not in CONSISTENT]
    own = [r for r in rows if r["scenario"] in (OWN, OWN_QUERY)]
    followers = [r for r in rows if r["scenario"] in (FOLLOWER, RANK_PROXY)]
    if rule == "content":
        title = "# The content check's decisions on the testbed"
        test = "(`capcal_integrations/content_check/contrast.py`)"
    else:
        title = f"# The {rule!r} rule's decisions on the testbed (guard=\"{rule}\", the default)"
        test = (f"on what the query adds (`capcal_integrations/content_check/query_contrast.py`: each list read in four orders "
                f"(six below ten slot pairs) with the query and again query-free, eight or twelve readings a query, each "
                f"query's e-value from the signs of its estimates; \"reads\" needs the alignment e-value at {align_e:g})")
    lines = [title, "",
             f"`{meta['command']}` ({meta['seconds']:.0f} s, {meta['when']}). Data: {meta['data']} "
             f"({meta['queries']} queries, grades from its qrels). Each decision runs the library's sequential test "
             f"{test} over queries drawn at random, until it decides or reaches {CAP} queries.", ""]
    if rule != "content":
        lines += ["What a query-free prompt shows the testbed's model: a relevance reader's grades become 0 (no query "
                  "to be relevant to); a reader of its own keeps its preferences; the first-stage follower loses its "
                  "preference (query-dependent, like lexical matching); the rank proxy keeps it (a passage property, "
                  "such as length, that correlates with the first stage's rank). Query-free prompts get their own "
                  "noise; a list's shared slot effects are the same in all of its readings.", ""]
    lines += ["## Without content (s = 0): false \"reads\"", "",
              "Goal: at most 1 %, with the exact 95 % upper bound at most 1.5 %.", "",
              "| scenario | shape | decisions | reads | rate | 95 % upper | does not read | undecided (cap) | median queries |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in nulls:
        ok = r["reads_rate"] <= 0.01 and r["reads_upper_95"] <= 0.015
        lines.append(f"| {r['scenario']} | {r['shape']} | {r['draws']} | {r['reads']} | {100 * r['reads_rate']:.2f} % | "
                     f"{100 * r['reads_upper_95']:.2f} %{'' if ok else ' ✗'} | {r['does_not_read']} | {r['undecided']} | "
                     f"{r['median_queries']} |")
    lines += ["", "## With content: \"reads\" within 12 and 24 queries", "",
              "Goal: within 24 queries in at least 95 % of runs at s = 0.5, within 12 at s = 1.", "",
              "| scenario | shape | s | decisions | reads within 12 | reads within 24 | reads at all | median queries |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in power:
        goal = r["reads_within_12"] if r["s"] >= 1 else r["reads_within_24"] if r["s"] >= 0.5 else 1.0
        mark = "" if goal >= 0.95 else " ✗"
        lines.append(f"| {r['scenario']} | {r['shape']} | {r['s']:g} | {r['draws']} | {100 * r['reads_within_12']:.1f} % | "
                     f"{100 * r['reads_within_24']:.1f} % | {100 * r['reads'] / r['draws']:.1f} %{mark} | "
                     f"{r['median_queries']} |")
    if own:
        if rule == "content":
            about = (f"The alignment evidence that \"reads\" needs reaches {ALIGN_E:g} with probability at most "
                     f"1/{ALIGN_E:g} for them (Ville's inequality).")
        else:
            about = ("Their preferences are the same with and without the query and cancel in what the query adds: "
                     "for this rule they are a null (false \"reads\" at most 1 % by the agreement e-process alone).")
        if any(r["scenario"] == OWN_QUERY for r in own):
            about += (f" `{OWN_QUERY}`: the same preferences, but gone without the query (the query creates them): "
                      "they do not cancel, and only the alignment evidence (`align_e`) can keep them out.")
        lines += ["", "## Readers of their own: \"reads\" is wrong for them too", "",
                  "Content read consistently (a preference per passage drawn at random, slope `s`) that follows neither "
                  f"relevance nor the first stage, as the packaged models read DL19. {about}", "",
                  "| scenario | s | shape | decisions | reads | rate | 95 % upper | does not read | undecided (cap) |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['scenario']} | {r['s']:g} | {r['shape']} | {r['draws']} | {r['reads']} | "
                  f"{100 * r['reads_rate']:.1f} % | {100 * r['reads_upper_95']:.1f} % | {r['does_not_read']} | "
                  f"{r['undecided']} |" for r in own]
    if followers:
        beta, sigma = meta.get("follower", FOLLOWER_SHAPE)
        lines += ["", "## First-stage followers", "",
                  f"A preference that is a noisy copy of the first stage's order (rank `i` of `n`: `-{beta:g} i / n + "
                  f"N(0, {sigma:g})`, read at slope `s`) and carries no relevance beyond it. `{FOLLOWER}`: "
                  f"query-dependent (lexical matching: gone without the query); `{RANK_PROXY}`: query-independent (a "
                  "passage property that correlates with the first stage's rank: the same without the query). "
                  + ("The content rule cannot tell them apart." if rule == "content" else
                     "The query rule sees the follower's preference as what the query adds; the rank proxy's cancels."),
                  "",
                  "| scenario | s | shape | decisions | reads | rate | 95 % upper | within 12 | within 24 | does not read | "
                  "undecided (cap) |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['scenario']} | {r['s']:g} | {r['shape']} | {r['draws']} | {r['reads']} | "
                  f"{100 * r['reads_rate']:.1f} % | {100 * r['reads_upper_95']:.1f} % | {100 * r['reads_within_12']:.1f} % | "
                  f"{100 * r['reads_within_24']:.1f} % | {r['does_not_read']} | {r['undecided']} |" for r in followers]
    swept = [r for r in rows if "by_align_e" in r]
    if swept:
        es = list(swept[0]["by_align_e"])
        lines += ["", "## By align_e (the same draws decided at each value)", "",
                  "Power: \"reads\" within 12 queries at s = 1, within 24 at s = .5 (fixed shape; worst scenario, and "
                  "the mean over scenarios). False \"reads\": the maximum over the null cells; readers of their own and "
                  "followers: \"reads\" at all.", "",
                  "| align_e | power s = 1 worst | s = 1 mean | power s = .5 worst | s = .5 mean | null max | "
                  + " | ".join(f"{r['scenario']} s = {r['s']:g}" for r in own + followers) + " |",
                  "|---:|" + "---:|" * (5 + len(own) + len(followers))]
        for e in es:
            cols = []
            for s, key in ((1.0, "reads_within_12"), (0.5, "reads_within_24")):
                got = [(r["by_align_e"][e][key], r["scenario"]) for r in power if r["s"] == s and r["shape"] == "fixed"
                       and "by_align_e" in r]
                if got:
                    w = min(got)
                    cols += [f"{100 * w[0]:.1f} % ({w[1]}){'' if w[0] >= 0.95 else ' ✗'}",
                             f"{100 * sum(g for g, _ in got) / len(got):.1f} %"]
                else:
                    cols += ["", ""]
            nl = [r["by_align_e"][e]["reads_rate"] for r in nulls if "by_align_e" in r]
            cols.append(f"{100 * max(nl):.2f} %" if nl else "")
            cols += [f"{100 * r['by_align_e'][e]['reads_rate']:.1f} %" for r in own + followers]
            lines.append(f"| {e} | " + " | ".join(cols) + " |")
        lines += ["", "Per cell (reads within 12 / within 24 / at all):", "",
                  "| scenario | shape | s | " + " | ".join(f"align_e = {e}" for e in es) + " |",
                  "|---|---|---:|" + "---|" * len(es)]
        for r in swept:
            if r["s"] == 0:
                continue
            lines.append(f"| {r['scenario']} | {r['shape']} | {r['s']:g} | " + " | ".join(
                f"{100 * r['by_align_e'][e]['reads_within_12']:.1f} / {100 * r['by_align_e'][e]['reads_within_24']:.1f} / "
                f"{100 * r['by_align_e'][e]['reads_rate']:.1f}" for e in es) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--rule", choices=RULE_NAMES, default="content", help="the content rule decided (default content)")
    ap.add_argument("--align-e", type=float, default=None, help="the alignment e-value \"reads\" needs (default: the "
                    "rule's; content: contrast.ALIGN_E, query: rules.QUERY_ALIGN_E)")
    ap.add_argument("--lambdas", default="", help="betting fractions of the agreement e-processes (comma list; default: "
                    "the rule's)")
    ap.add_argument("--bet-pairs", type=int, default=None, help="lists of fewer slot pairs bet pairs / this of the "
                    "agreement bets (0: all the same; default: the rule's Evidence.bet_pairs)")
    ap.add_argument("--sweep", default="", help="align_e values at which every draw is also decided (comma list)")
    ap.add_argument("--draws", type=int, default=2000, help="decisions per null cell")
    ap.add_argument("--power-draws", type=int, default=400, help="decisions per cell with content")
    ap.add_argument("--scenarios", default=",".join(NULL_SCENARIOS))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--s", default="0.3,0.5,1", help="content slopes of the power cells")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results path without suffix (default benchmarks/results/decisions, "
                    "decisions-<rule> for another rule)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--all-shapes", action="store_true", help="every shape for every scenario (default: the mixed and "
                    "windows shapes on no-delta, the equal-noise scenario)")
    ap.add_argument("--no-own", action="store_true", help="skip the readers of their own")
    ap.add_argument("--followers", action="store_true", help=f"also the first-stage follower, the rank proxy and the "
                    f"readers of their own whose preferences need the query ({FOLLOWER}, {RANK_PROXY}, {OWN_QUERY}) at "
                    "s = .5 and 1, fixed shape")
    a = ap.parse_args()
    grades = load_grades(a.data)
    start = time.perf_counter()
    rows = []
    shapes = a.shapes.split(",")
    align_e = default_align_e(a.rule) if a.align_e is None else a.align_e
    sweep = tuple(float(x) for x in a.sweep.split(",") if x)
    cells = [(sc, sh) for sc in a.scenarios.split(",") for sh in shapes if sh == "fixed" or sc == "no-delta" or a.all_shapes]
    global LAMBDAS_OVERRIDE, BET_PAIRS_OVERRIDE
    LAMBDAS_OVERRIDE = tuple(float(x) for x in a.lambdas.split(",")) if a.lambdas else ()
    BET_PAIRS_OVERRIDE = a.bet_pairs
    with multiprocessing.Pool(a.workers) as pool:
        def run(scenario: str, s: float, shape: str, draws: int) -> dict:
            return cell(pool, scenario, s, shape, draws, grades, a.seed, a.rule, align_e, sweep)

        for scenario, shape in cells:
            rows.append(run(scenario, 0.0, shape, a.draws))
            for s in (float(x) for x in a.s.split(",") if x):
                rows.append(run(scenario, s, shape, a.power_draws))
        if not a.no_own:
            for s in (0.5, 1.0):
                rows.append(run(OWN, s, "fixed", a.power_draws))
        if a.followers:
            for scenario in (OWN_QUERY, FOLLOWER, RANK_PROXY):
                for s in (0.5, 1.0):
                    rows.append(run(scenario, s, "fixed", a.power_draws))
    meta = {"command": "python benchmarks/decisions.py " + " ".join(sys.argv[1:]), "seconds": time.perf_counter() - start,
            "when": time.strftime("%Y-%m-%d"), "data": pathlib.Path(a.data).name, "queries": len(grades)}
    if a.rule != "content" or a.align_e is not None or sweep or a.followers:
        meta.update({"rule": a.rule, "align_e": align_e, "sweep": list(sweep), "follower": list(FOLLOWER_SHAPE),
                     "workers": a.workers, "seed": a.seed})
    out = pathlib.Path(a.out or HERE / "results" / ("decisions" if a.rule == "content" else f"decisions-{a.rule}"))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(rows, meta))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
