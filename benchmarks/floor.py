"""At the floor of the server: what each method costs against what it cannot avoid (issue 35).

For each list (cold: a fresh salt in every passage, so no prompt is cached from anything before it), on one
server in one run, interleaved:

* **generating**: one chat completion of RankGPT's prompt over the same passages, at most 100 generated tokens
  (what RankGPTRerank and LLMListwiseRerank send);
* **vanilla** and **capcal** (``guard=None``), and **one deciding query** of the content check (its readings of
  the list, :func:`~capcal_integrations.ranking.decoding.check_readings`);
* **the floor** of each: prefilling each distinct stream once (a request that generates one token, timed on a
  cold copy of the stream) plus the evaluations the method cannot avoid (the decoded ranking's tokens, at the
  per-token time of the generating request): vanilla = prefill(real) + tokens x t_token; capcal = prefill(real)
  + prefill(empty) + 2 x tokens x t_token; a deciding query = the prefill of each of its streams (12 orders of
  the window, with and without the query, approximated by the real stream's prefill, plus the empty prompt's).

Reported per list and as medians: time / floor, time / generating, and uncached prompt tokens / the tokens of
the distinct streams (what the server computed against what it had to). Results: ``benchmarks/results/floor.md``
and ``floor.json``.

    python benchmarks/floor.py --data ../shared/data/trec-dl19-passage [--lists 3] [--passages 20] [--base-url URL]

Without ``--base-url`` it starts the embedded server (``--model``, default the packaged 0.5B) for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import DEFAULT_PLACEHOLDER, RANK_GPT, CapCalReranker  # noqa: E402
from capcal_integrations.content_check.rules import RULES  # noqa: E402
from capcal_integrations.endpoints import tokenize  # noqa: E402
from capcal_integrations.prompts.render import labels, render_prompt, resolve_template  # noqa: E402
from capcal_integrations.ranking.decoding import check_readings  # noqa: E402
from capcal_integrations.ranking.orders import kendall_tau  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists, ndcg10  # noqa: E402
from capcal_integrations.transport.drivers import run_sync  # noqa: E402


def _chat(rr: CapCalReranker, messages: Any, max_tokens: int) -> tuple[float, int, int]:
    """One chat completion: seconds, prompt tokens, completion tokens."""
    started = time.perf_counter()
    answer = rr.client.chat.completions.create(model=rr.capabilities().model, temperature=0, max_tokens=max_tokens,
                                               messages=[{"role": r, "content": c} for r, c in messages])
    usage = answer.usage
    return time.perf_counter() - started, usage.prompt_tokens, usage.completion_tokens


def _messages(template: Any, query: str, texts: list[str]) -> Any:
    return render_prompt(resolve_template(template), query, texts, labels(len(texts))).text()


#: The methods timed per list: (row name, method, options). The trie form asks only the branching nodes of the
#: identifier trie at each step (about 3 of 21 on a 20-passage list), renormalising at each node. ``async``: the
#: same ranking through ``arerank``.
METHODS = (("vanilla", "vanilla", {}), ("capcal", "capcal", {}),
           ("vanilla, trie", "vanilla", {"probability": "trie"}), ("capcal, trie", "capcal", {"probability": "trie"}),
           ("capcal, async", "capcal", {}))
ROWS = tuple(name for name, _, _ in METHODS) + ("deciding",)
ALL = ";".join(name for name, _, _ in METHODS)


def one_list(rr: CapCalReranker, query: str, passages: list[str], grades: list[int], ideal: list[int],
             deciding: bool = True, rows: tuple[str, ...] = ROWS) -> dict[str, Any]:
    def salted() -> list[str]:
        salt = f" ({random.randrange(10 ** 12)})"
        return [p + salt for p in passages]

    opts = rr.options
    row: dict[str, Any] = {"query": query, "passages": len(passages), "grades": grades, "ideal": ideal}
    # the generating peer, and the server's per-token time from it (one token against up to 100)
    gen_s, gen_prompt, gen_tokens = _chat(rr, _messages(RANK_GPT, query, salted()), 100)
    one_s, _, _ = _chat(rr, _messages(RANK_GPT, query, salted()), 1)
    per_token = max(0.0, (gen_s - one_s) / max(1, gen_tokens - 1))
    row.update(generating_s=round(gen_s, 2), generating_tokens=gen_tokens, per_token_s=round(per_token, 4))
    # the floor's prefills: the library's real stream and its empty stream, each cold
    real_s, real_tokens, _ = _chat(rr, _messages(opts.template, query, salted()), 1)
    empty_s, empty_tokens, _ = _chat(rr, _messages(opts.template, query, [DEFAULT_PLACEHOLDER] * len(passages)), 1)
    row.update(prefill_real_s=round(real_s, 2), real_tokens=real_tokens, prefill_empty_s=round(empty_s, 2),
               empty_tokens=empty_tokens)
    for name, method, extra in (m for m in METHODS if m[0] in rows):
        started = time.perf_counter()
        ranked = rr.with_options(method=method, **extra)
        # arerank sends a step's real and empty streams together (two slots, one batch); rerank one after another
        ranking = asyncio.run(ranked.arerank(query, salted())) if name.endswith("async") else ranked.rerank(query, salted())
        took = time.perf_counter() - started
        answer = " > ".join(f"[{i + 1}]" for i in ranking.order)
        tokens = len(run_sync(tokenize(rr.capabilities(), [answer]), rr.client)[0][0])
        floor = real_s + tokens * per_token if method == "vanilla" else real_s + empty_s + 2 * tokens * per_token
        streams = real_tokens if method == "vanilla" else real_tokens + empty_tokens
        u = ranking.usage
        row[name] = {"order": list(ranking.order), "ndcg10": round(ndcg10([grades[i] for i in ranking.order], ideal), 4),
                     "s": round(took, 2), "floor_s": round(floor, 2), "over_floor": round(took / floor, 2),
                       "over_generating": round(took / gen_s, 2), "requests": u.requests,
                       "uncached_over_streams": round((u.prompt_tokens - u.cached_tokens) / max(1, streams), 2)}
    if not deciding:
        return row
    window = min(len(passages), opts.window)
    started = time.perf_counter()
    _, u = run_sync(check_readings(rr._state.for_ranking(), opts.replace(alpha=1.0), query, salted()[:window],
                                   RULES["query"]), rr.client)
    took = time.perf_counter() - started
    floor = 12 * real_s * window / len(passages) + empty_s
    streams = 12 * real_tokens * window // len(passages) + empty_tokens
    row["deciding"] = {"s": round(took, 2), "floor_s": round(floor, 2), "over_floor": round(took / floor, 2),
                       "over_generating": round(took / gen_s, 2), "requests": u.requests,
                       "uncached_over_streams": round((u.prompt_tokens - u.cached_tokens) / max(1, streams), 2)}
    return row


def _same_orders(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The two probability forms' orders side by side, and nDCG@10 (the lists' qrels) per method."""
    lines = ["Quality, the same lists: mean nDCG@10 " + ", ".join(
        f"{m} {statistics.mean(r[m]['ndcg10'] for r in rows):.4f}" for m in names if m != "deciding"
        and all("ndcg10" in r[m] for r in rows)) + "."]
    for form in ("", ", trie"):
        v, c = f"vanilla{form}", f"capcal{form}"
        if v in names and c in names:
            lines.append(f"capcal / vanilla{form or ', joint'}: median per list "
                         f"{statistics.median(r[c]['s'] / r[v]['s'] for r in rows):.2f}.")
    for m in ("vanilla", "capcal"):
        t = f"{m}, trie"
        if m in names and t in names and all("order" in r[m] and "order" in r[t] for r in rows):
            same = sum(r[m]["order"] == r[t]["order"] for r in rows)
            tau = statistics.mean(kendall_tau(r[m]["order"], r[t]["order"]) for r in rows)
            lines.append(f"{m}: the trie form's order is the joint form's on {same} of {len(rows)} lists (mean "
                         f"Kendall tau {tau:.3f}).")
    return [" ".join(lines)]


def _write(out: pathlib.Path, args: argparse.Namespace, rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), **info, "rows": rows}, indent=1) + "\n")
    names = [m for m in ROWS if all(m in r for r in rows)]
    med = {m: {k: statistics.median(r[m][k] for r in rows) for k in rows[0][m] if k not in ("order", "ndcg10")}
           for m in names}
    lines = ["# At the floor of the server (issue 35)", "",
             f"`python benchmarks/floor.py --data {args.data} --lists {args.lists} --passages {args.passages}"
             f"{' --no-deciding' if getattr(args, 'no_deciding', False) else ''}"
             f"{'' if getattr(args, 'methods', None) in (None, ALL) else f' --methods {args.methods!r}'}"
             "` on "
             f"{info['server']} ({info['model']}, {info['slots']} slots), commit {info['commit']}, {len(rows)} lists, "
             "each cold (a fresh salt in every passage), methods interleaved per list. Floor: each distinct stream "
             "prefilled once plus the decoded answer's tokens at the generating request's per-token time (module "
             "docstring). Medians:", "",
             "| method | seconds | floor s | time / floor | time / generating | requests | uncached prompt tokens / "
             "stream tokens |", "|---|---:|---:|---:|---:|---:|---:|"]
    for m in names:
        d = med[m]
        lines.append(f"| {m if m != 'deciding' else 'one deciding query'} | {d['s']:.1f} | {d['floor_s']:.1f} | "
                     f"{d['over_floor']:.2f} | {d['over_generating']:.2f} | {d['requests']:.0f} | "
                     f"{d['uncached_over_streams']:.2f} |")
    g = statistics.median(r["generating_s"] for r in rows)
    lines += ["", f"One generating request (RankGPT's prompt, at most 100 tokens): median {g:.1f} s.", "",
              "Read with care: the per-token time comes from each list's own generating request, and is 0 where the "
              "model stopped after a few tokens (then that list's vanilla and capcal floors are its prefills alone, a "
              "little low)." + (" The deciding query's floor counts 12 whole streams, but its orders share their "
              "prefix (the system prompt, the head, the query), so its true floor is lower: time / floor under 1 and "
              "uncached tokens / stream tokens of 0.65 say that the server computed about two thirds of what 12 "
              "whole streams would hold; measuring its exact floor needs the 12 prompts themselves."
                                 if "deciding" in names else ""), "",
              *_same_orders(rows, names), "",
              "Per list, seconds (x floor):", "", "| list | generating s | " + " | ".join(names) + " |",
              "|---|---:|" + "---:|" * len(names)]
    for k, r in enumerate(rows):
        lines.append(f"| {k} | {r['generating_s']:.1f} | "
                     + " | ".join(f"{r[m]['s']:.1f} ({r[m]['over_floor']:.2f})" for m in names) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a dataset folder, e.g. ../shared/data/trec-dl19-passage")
    ap.add_argument("--lists", type=int, default=3)
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--base-url", default=None, help="a running server; default: start the embedded one")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="0.5b", help="the embedded model (without --base-url)")
    ap.add_argument("--out", default=str(HERE / "results" / "floor"))
    ap.add_argument("--methods", default=ALL,
                    help="the rows to time, separated by ';' (default all: %(default)s)")
    ap.add_argument("--no-deciding", action="store_true", help="skip the deciding query (about 200 s a list)")
    ap.add_argument("--report", action="store_true", help="rewrite the .md from the saved .json, nothing run")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(pathlib.Path(args.out).with_suffix(".json").read_text())
        rows = saved.pop("rows")
        _write(pathlib.Path(args.out), argparse.Namespace(**saved.pop("args")), rows, saved)
        print(pathlib.Path(args.out).with_suffix(".md").read_text())
        return 0
    from capcal_integrations.server.launcher import endpoint

    lists = bench_lists(args.data)[:args.lists]
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with endpoint(args.base_url, args.model) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key or args.api_key, model=ep.model, timeout=3600,
                            guard=None)
        caps = rr.capabilities()
        info = {"server": caps.server or caps.kind.name, "model": caps.model, "slots": caps.slots, "commit": commit}
        rows = []
        for k, b in enumerate(lists):
            rows.append(one_list(rr, b.query, list(b.passages)[:args.passages], list(b.grades)[:args.passages],
                                 list(b.ideal), not args.no_deciding, tuple(args.methods.split(";"))))
            print(f"list {k + 1}/{len(lists)}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
            _write(pathlib.Path(args.out), args, rows, info)
    print(pathlib.Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
