"""The ``lazy`` part of ``python -m benchmarks.fidelity``: lazy capcal against the whole reading on a real server.

Each list is ranked by capcal whole (every trie node of both streams, each prompt's answer recorded by
:class:`~benchmarks._common.Replay`) and lazily (middle steps certified by bounds), each prompt the lazy reading
asks answered from that record: a differing order would be the certificate's, not the server's drift. ``--rounds``
ranks the lazy reading once per bound on a step's rounds (:data:`~capcal_integrations.reading.certified.ROUNDS`
by default) on the same record, so their nodes compare on the same answers.

``--known`` ranks each list once more, each middle step first asking every node (from the record) and making the plan
of :mod:`~capcal_integrations.reading.certified` with every value known (a read's value where the lazy plan takes its
bound): the nodes a planner that knew the answers would ask after the branching nodes, against those the lazy
reading asked at the same steps; what the certificate itself needs, whatever the plan.

``--testbed`` replays the testbed's scenarios instead (:mod:`capcal_integrations.testbed.lazy`; no server):
``--lists`` per scenario and strength, ``--window-lists`` 100-passage lists, and ``--raw-lists`` of the raw form
(``normalise=False``) on the peaked prior, each bound of ``--rounds`` on the same lists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from typing import Any

from benchmarks import _common as C
from capcal_integrations import CapCalReranker
from capcal_integrations.reading import certified


def add_arguments(lz: argparse.ArgumentParser) -> None:
    lz.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    lz.add_argument("--lists", type=int, default=10)
    lz.add_argument("--passages", type=int, default=20)
    lz.add_argument("--alphas", default="adaptive,1.0", help="strengths, comma-separated (default %(default)s)")
    lz.add_argument("--rounds", default=str(certified.ROUNDS),
                    help="bounds on a lazy step's rounds, comma-separated (default %(default)s: the library's)")
    lz.add_argument("--known", action="store_true", help="also the nodes a plan knowing every value asks (middle steps)")
    lz.add_argument("--testbed", action="store_true", help="the testbed's scenarios instead of a server (no server)")
    lz.add_argument("--window-lists", type=int, default=10, help="--testbed: 100-passage lists per strength")
    lz.add_argument("--raw-lists", type=int, default=20, help="--testbed: lists of the raw form (peaked prior)")
    lz.add_argument("--preset", default=None, help="the reranker's preset (release: the raw form, the authors' prompt)")
    lz.add_argument("--base-url", default=None)
    lz.add_argument("--model", default="0.5b")
    lz.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"))


def _nodes(sent: list) -> int:
    """Each prompt of a completions prompt list, each chat request."""
    from capcal_integrations.testbed.endpoint import _prompt_list

    return sum(len(_prompt_list(json.loads(r.content)["prompt"])) if r.url.path.endswith("/v1/completions")
               else r.url.path.endswith("/chat/completions") for r in sent)


@contextlib.contextmanager
def _knowing(sent: list, log: list):
    """Each lazy capcal step (``decoding.certified_labels``) first asks every node, then plans knowing the values
    (:func:`~capcal_integrations.reading.certified._plan` with ``values``), then reads as the library does; ``log``
    gets per step the nodes the known plan asks (branching nodes included) and those the library's reading asked."""
    from capcal_integrations.endpoints import Query, next_token_logprobs
    from capcal_integrations.ranking import decoding
    from capcal_integrations.reading.labels import (
        branching_nodes,
        label_trie,
        largest_top,
        nodes_to_ask,
        score_labels,
        unread_nodes,
    )

    inner = decoding.certified_labels

    def knowing(state, streams, prefix, labels, *, alpha, normalise_shares=True, top=20, shared=False, render="chat"):
        children = label_trie(labels)
        needed = nodes_to_ask(children, "joint", shared=shared)
        first = branching_nodes(children, needed, labels)
        queries = [Query(m, prefix + n, tuple(children[n]), render) for m in streams for n in needed]
        found = yield from next_token_logprobs(state, queries, min(top, largest_top(state, top)))
        truth = [dict(zip(needed, found[:len(needed)])), dict(zip(needed, found[len(needed):]))]
        boxes, values, missing = [], [], []
        for answers in truth:
            branching = {n: answers[n] for n in first}
            lost = unread_nodes(labels, needed, branching)
            bound = score_labels(labels, children, branching, "joint").logprobs
            exact = score_labels(labels, children, answers, "joint").logprobs
            shift = max(bound) if normalise_shares else 0.0
            boxes.append(certified._box(bound, lost, normalise_shares))
            values.append([min(math.exp(v - shift), hi) for v, (_, hi) in zip(exact, boxes[-1])])
            missing.append(lost)
        c = certified._best_at_bounds([[(v, v) for v in vs] for vs in values], alpha, normalise_shares)
        plan = certified._plan(c, boxes, alpha, normalise_shares, values)
        reads = (len(needed) * 2 - 2 * len(first) if plan is None else
                 sum(len({n for t, i in plan if t == s for n in missing[s][i]}) for s in (0, 1)))
        k = len(sent)
        out = yield from inner(state, streams, prefix, labels, alpha=alpha, normalise_shares=normalise_shares, top=top,
                               shared=shared, render=render)
        log.append({"known": 2 * len(first) + reads, "lazy": _nodes(sent[k:]), "requests": len(sent) - k})
        return out

    decoding.certified_labels = knowing
    try:
        yield
    finally:
        decoding.certified_labels = inner


@contextlib.contextmanager
def _rounds(n: int):
    """The library's bound on a lazy step's rounds set to ``n`` (a benchmark's comparison; restored after)."""
    kept, certified.ROUNDS = certified.ROUNDS, n
    try:
        yield
    finally:
        certified.ROUNDS = kept


def testbed(args: argparse.Namespace, stamp: dict) -> dict[str, Any]:
    """Lazy capcal against the whole reading on the testbed's scenarios, per bound on a step's rounds."""
    from capcal_integrations.testbed.lazy import SCENARIOS, replay

    k = 2 if args.smoke else args.lists
    cells = [(name, alpha, {}) for name in SCENARIOS for alpha in (1.0, "adaptive")]
    cells += [("peaked prior", "adaptive", {"normalise": False})] if args.raw_lists else []
    rows = []
    for n in (int(x) for x in args.rounds.split(",")):
        for j, (name, alpha, options) in enumerate(cells):
            lists = min(k, args.window_lists) if name.startswith("windows") else min(k, args.raw_lists) if options else k
            with _rounds(n):
                r = replay(name, alpha, lists, seed=1000 + j, **options)
            rows.append({"scenario": name, "alpha": alpha, "form": "raw" if options else "normalised", "rounds": n,
                         **vars(r)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = [[r["scenario"], r["alpha"], r["form"], r["rounds"], r["lists"], r["identical"],
              f"{r['certified_early']} / {r['middle_steps']}", f"{r['nodes_lazy'] / r['lists']:.1f}",
              f"{r['nodes_whole'] / r['lists']:.1f}", f"{r['nodes_lazy'] / r['nodes_whole']:.2f}"] for r in rows]
    summary = []
    for n in dict.fromkeys(r["rounds"] for r in rows):
        rs = [r for r in rows if r["rounds"] == n]
        lazy_, whole = sum(r["nodes_lazy"] for r in rs), sum(r["nodes_whole"] for r in rs)
        summary.append(f"At most {n} rounds a step: **{sum(r['identical'] for r in rs)} of {sum(r['lists'] for r in rs)} "
                       f"lists identical**; nodes asked, all lists: {lazy_} lazy against {whole} whole ({lazy_ / whole:.2f}).")
    return {"name": args.name or "lazy-testbed" + ("-smoke" if args.smoke else ""), "stamp": stamp,
            "title": "Lazy capcal against the whole reading on the testbed",
            "notes": ["Each list ranked by capcal twice on the testbed's simulated llama.cpp server "
                      "(capcal_integrations.testbed.lazy): lazily (middle steps ask the trie nodes a certified choice "
                      "needs, in at most *rounds* rounds a step) and whole (every node). *identical*: lists whose orders "
                      "are the same; *certified early*: middle steps (not a window's first or last) certified before "
                      "every node was read; *nodes*: prompts asked per list (both streams).", *summary],
            "tables": [{"columns": ["scenario", "alpha", "form", "rounds", "lists", "identical",
                                    "middle steps certified early", "nodes / list, lazy", "nodes / list, whole",
                                    "lazy / whole"], "rows": table}],
            "data": {"rows": rows}}


def lazy(args: argparse.Namespace, stamp: dict) -> dict[str, Any]:
    """Lazy capcal against the whole reading on a real server: the lazy reading answered from the whole one's record."""
    if args.testbed:
        return testbed(args, stamp)
    import httpx
    import openai

    from capcal_integrations.testbed.measure import bench_lists
    from capcal_integrations.testing import every_node

    rows, sent, replay = [], [], C.Replay()
    bounds = [int(x) for x in args.rounds.split(",")]
    lists = bench_lists(args.data or C.need_data("trec-dl19-passage"))[:2 if args.smoke else args.lists]
    with C.server(args.base_url, args.model, args.engine) as ep:
        http = httpx.Client(transport=replay, event_hooks={"request": [sent.append]}, timeout=3600)
        rr = CapCalReranker(client=openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key or "x", http_client=http,
                                                 max_retries=0), model=ep.model, guard=None, preset=args.preset)
        caps = rr.capabilities()
        for k, b in enumerate(lists):
            passages = list(b.passages)[:5 if args.smoke else args.passages]
            for alpha in (a if a == "adaptive" else float(a) for a in args.alphas.split(",")):
                one = rr.with_options(method="capcal", alpha=alpha)
                replay.record.clear()
                sent.clear()
                replay.recording, replay.missed = True, 0  # the whole reading recorded
                with every_node(one) as ranked:
                    wh = ranked.rerank(b.query, passages)
                nodes_whole = _nodes(sent)
                for n in bounds:  # each lazy reading answered from the record
                    sent.clear()
                    replay.recording, replay.missed = False, 0
                    with _rounds(n):
                        lz = one.rerank(b.query, passages)
                    row = {"list": k, "alpha": alpha, "rounds": n, "nodes_whole": nodes_whole, "nodes_lazy": _nodes(sent),
                           "requests_lazy": len(sent), "identical": lz.order == wh.order,
                           "pruned": sum(s.pruned > 0 for s in lz.steps), "steps": len(lz.steps),
                           "not_in_record": replay.missed,
                           "parted": next(([i, max(w.scores) - w.scores[w.candidates.index(a.chosen)]] for i, (a, w) in
                                           enumerate(zip(lz.steps, wh.steps)) if a.chosen != w.chosen), None)}
                    if args.known and n == bounds[-1]:  # the known plan's nodes at the same steps
                        log: list = []
                        with _rounds(n), _knowing(sent, log):
                            known = one.rerank(b.query, passages)
                        row.update(same_known=known.order == lz.order, middle_steps=len(log),
                                   middle_known=sum(x["known"] for x in log), middle_lazy=sum(x["lazy"] for x in log),
                                   middle_requests=sum(x["requests"] for x in log))
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    table = []
    for alpha, n in dict.fromkeys((r["alpha"], r["rounds"]) for r in rows):
        rs = [r for r in rows if r["alpha"] == alpha and r["rounds"] == n]
        nl, nw = (sum(r[k] for r in rs) / len(rs) for k in ("nodes_lazy", "nodes_whole"))
        table.append([alpha, n, len(rs), sum(r["identical"] for r in rs), ", ".join(
            f"{r['parted'][0]}: {r['parted'][1]:.3f}" for r in rs if r["parted"]) or "none",
            f"{sum(r['pruned'] for r in rs)} / {sum(r['steps'] - 2 for r in rs)}", f"{nl:.0f}",
            f"{statistics.median(r['nodes_lazy'] for r in rs):.0f}", f"{nw:.0f}", f"{nl / nw:.2f}",
            sum(r["not_in_record"] for r in rs)])
    known = [f"Alpha {alpha}, {sum(r['middle_steps'] for r in rs)} middle steps (`--known`): the library's reading "
             f"asked {sum(r['middle_lazy'] for r in rs) / sum(r['middle_steps'] for r in rs):.2f} nodes a step in "
             f"{sum(r['middle_requests'] for r in rs) / sum(r['middle_steps'] for r in rs):.2f} requests; a plan knowing "
             f"every value, {sum(r['middle_known'] for r in rs) / sum(r['middle_steps'] for r in rs):.2f} (the branching "
             f"nodes of both streams included); same order with it on {sum(r['same_known'] for r in rs)} of {len(rs)} lists."
             for alpha in dict.fromkeys(r["alpha"] for r in rows)
             if (rs := [r for r in rows if r["alpha"] == alpha and "middle_known" in r])]
    server = caps.server or caps.kind.name
    return {"name": args.name or f"lazy-live-{server}" + ("-smoke" if args.smoke else ""), "stamp": stamp,
            "title": f"Lazy capcal against the whole reading, live on {server}",
            "notes": ["Each list ranked by capcal twice: whole (every trie node of both streams, each prompt's answer "
                      "recorded) and lazy (middle steps certified by bounds), each prompt it asks answered from that "
                      "record: a differing order would be the certificate's, not the server's drift. *rounds*: the "
                      "bound on a lazy step's rounds (the last reads every node left). *parted*: the step where the "
                      "choices first differ and how far the lazy choice's calibrated score is below the whole "
                      "reading's best there. A cold list's cost in seconds is the cost command's.", *known],
            "tables": [{"columns": ["alpha", "rounds", "lists", "identical orders", "parted (step: gap)",
                                    "middle steps certified early", "nodes / list, lazy", "median", "nodes / list, whole",
                                    "lazy / whole", "lazy prompts not in the record"], "rows": table}],
            "data": {"model": caps.model, "rows": rows}}
