"""The ``capcal`` command: ``serve``, ``rerank``, ``tune``, ``demo`` and ``eval``.

With no ``--base-url`` (and no ``$CAPCAL_BASE_URL``), ``rerank``, ``tune`` and ``demo`` reuse a server already
listening on 127.0.0.1:8080 or start the embedded one for the duration of the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any, TextIO

from .errors import CapCalError
from .reranker import CapCalReranker
from .strategies import METHODS

log = logging.getLogger("capcal")


def _out(text: str = "", stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


@contextlib.contextmanager
def endpoint(base_url: str | None, model: str) -> Iterator[str]:
    """An endpoint to talk to: the one given, one already on 127.0.0.1:8080, or a fresh embedded one."""
    base_url = base_url or os.environ.get("CAPCAL_BASE_URL")
    if base_url:
        yield base_url
        return
    from .server import EmbeddedServer, find_running

    running = find_running("127.0.0.1", 8080)
    if running:
        log.info("using the server already running at %s", running)
        yield running
        return
    _out(f"capcal: starting the embedded {model} model server (no --base-url given)...", sys.stderr)
    with EmbeddedServer(model=model) as server:
        yield server.base_url


def _reranker(args: argparse.Namespace, base_url: str, **overrides: Any) -> CapCalReranker:
    alpha: float | str = args.alpha if args.alpha == "adaptive" else float(args.alpha)
    options = dict(base_url=base_url, model=args.model_name, method=args.method, alpha=alpha,
                   probability=args.probability, window=args.window, stride=args.stride)
    if args.placeholder is not None:
        options["placeholder"] = args.placeholder
    options.update(overrides)
    return CapCalReranker(**options)


def _add_method_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 (default: embedded)")
    p.add_argument("--model", default="0.5b", help="embedded model to start when no endpoint is given (0.5b, 1.5b, smollm2)")
    p.add_argument("--model-name", default=None, help="model name to send to the endpoint (default: the first it lists)")
    p.add_argument("--method", default="capcal", choices=METHODS)
    p.add_argument("--alpha", default="adaptive", help="'adaptive' (default) or a fixed strength such as 1.0")
    p.add_argument("--placeholder", default=None, help="body of the content-free passages (default: the paper's)")
    p.add_argument("--probability", default="joint", choices=("joint", "trie"))
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--stride", type=int, default=10)


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """The lists to work on, read by :func:`_read_requests`."""
    p.add_argument("--query", help="the query (with --passages)")
    p.add_argument("--passages", help="file with one passage per line (or JSONL objects with 'text')")
    p.add_argument("--input", help="JSONL with {'query': ..., 'passages': [...]} per line ('-' for stdin)")


# --------------------------------------------------------------------------- rerank


def _read_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--query`` + ``--passages FILE`` (one passage per line, or JSONL with ``text``), or ``--input``
    JSONL with ``{"query": ..., "passages": [...]}`` (``candidates`` also accepted) per line."""
    if args.input:
        with open(args.input, encoding="utf-8") if args.input != "-" else contextlib.nullcontext(sys.stdin) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows:
            row.setdefault("passages", row.get("candidates"))
            if not isinstance(row.get("query"), str) or not isinstance(row.get("passages"), list):
                raise SystemExit(f"capcal {args.command}: every --input line needs 'query' and 'passages': {str(row)[:120]}")
        return rows
    if not (args.query and args.passages):
        raise SystemExit(f"capcal {args.command}: give --query and --passages FILE, or --input JSONL")
    with open(args.passages, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    passages = [json.loads(line) if line.lstrip().startswith("{") else line for line in lines]
    return [{"query": args.query, "passages": passages}]


def cmd_rerank(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    requests = _read_requests(args)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with endpoint(args.base_url, args.model) as url, out:
        rr = _reranker(args, url)
        for row in tqdm(requests, desc=f"rerank ({args.method})", unit="query", disable=len(requests) < 2 and None):
            ranking = rr.rerank(row["query"], row["passages"])
            ranked = [{"index": i, "score": ranking.scores[i], "passage": row["passages"][i]} for i in ranking.order]
            if args.top_n:
                ranked = ranked[: args.top_n]
            record = {"query": row["query"], "method": ranking.method, "order": list(ranking.order), "ranked": ranked,
                      "requests": ranking.usage.requests, "upper_bounds": ranking.upper_bounds}
            if "qid" in row:
                record["qid"] = row["qid"]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
    return 0


# --------------------------------------------------------------------------- tune


def cmd_tune(args: argparse.Namespace) -> int:
    from .tuning import DEFAULT_ALPHAS, choose_alpha

    requests = _read_requests(args)
    alphas = tuple(float(a) for a in args.alphas.split(",")) if args.alphas else DEFAULT_ALPHAS
    with endpoint(args.base_url, args.model) as url:
        rr = _reranker(args, url)
        _out(f"capcal tune: {len(requests)} lists x {args.shuffles} shuffles, one decoding step each...", sys.stderr)
        choice = choose_alpha(rr, [(r["query"], r["passages"]) for r in requests], alphas=alphas,
                              shuffles=args.shuffles, seed=args.seed, form=args.form)
    _out(json.dumps({"alpha": choice.alpha, "form": choice.form, "tau_by_alpha": choice.curve,
                     "queries": choice.queries, "shuffles": choice.shuffles, "requests": choice.usage.requests,
                     "weak": choice.weak}))
    _out(f"use: --alpha {choice.alpha:g}" + (" --calibration log" if choice.form == "log" else ""), sys.stderr)
    return 0


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    demo = json.loads(resources.files("capcal_integrations").joinpath("demo.json").read_text(encoding="utf-8"))
    query, passages = demo["query"], demo["passages"]
    texts = [p["text"] for p in passages]
    _out(f"Query: {query}   ({len(texts)} BM25 passages from TREC DL19; grade = NIST relevance 0-3)\n")
    results = {}
    with endpoint(args.base_url, args.model) as url:
        rr = _reranker(args, url)
        for method in tqdm(("vanilla", "capcal"), desc="reranking (cold prompts take ~10 s on 2 cores)", unit="method"):
            start = time.perf_counter()
            results[method] = (rr.with_options(method=method).rerank(query, texts), time.perf_counter() - start)
    prior = results["capcal"][0].prior or ()
    _out("Empty-prompt prior (what the model gives each slot with no content):")
    _out("  " + "  ".join(f"[{i + 1}] {p:.2f}" for i, p in enumerate(prior)) + "\n")
    _out(f"{'rank':>4}  {'vanilla':<26}{'capcal':<26}")
    for r in range(len(texts)):
        cells = []
        for method in ("vanilla", "capcal"):
            i = results[method][0].order[r]
            cells.append(f"[{i + 1}] grade {passages[i]['grade']}  {passages[i]['text'][:9]}…")
        _out(f"{r + 1:>4}  {cells[0]:<26}{cells[1]:<26}")
    _out()
    for method, (ranking, seconds) in results.items():
        best = next(r for r, i in enumerate(ranking.order) if passages[i]["grade"] == max(p["grade"] for p in passages))
        _out(f"{method:>8}: most relevant passage at rank {best + 1}; {ranking.usage.requests} requests, {seconds:.1f} s")
    return 0


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capcal", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log requests and decisions")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the embedded model with llama.cpp's OpenAI-compatible server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model", default="0.5b", help="0.5b (default), 1.5b or smollm2")
    p.add_argument("--n-parallel", type=int, default=8, help="server slots (real and empty prompts keep one each)")

    p = sub.add_parser("rerank", help="rerank passages from a file or JSONL; JSONL out")
    _add_input_options(p)
    p.add_argument("--output", help="write JSONL here instead of stdout")
    p.add_argument("--top-n", type=int, default=None)
    _add_method_options(p)

    p = sub.add_parser("tune", help="choose alpha without labels: the most shuffle-consistent strength (JSON out)")
    _add_input_options(p)
    p.add_argument("--shuffles", type=int, default=4, help="random orders per list (default 4)")
    p.add_argument("--alphas", default=None, help="comma-separated strengths to try (default 0,0.25,...,2)")
    p.add_argument("--form", default=None, choices=("additive", "log"), help="calibration form (default additive)")
    p.add_argument("--seed", type=int, default=0)
    _add_method_options(p)

    p = sub.add_parser("demo", help="one real query: vanilla vs CapCal, with the empty-prompt prior")
    _add_method_options(p)

    sub.add_parser("eval", help="evaluate methods on a benchmark (see `capcal eval --help`)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:
        from .evaluation import main as eval_main

        return eval_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        if args.command == "serve":
            from .server import serve

            serve(args.model, args.host, args.port, n_parallel=args.n_parallel)
            return 0
        return {"rerank": cmd_rerank, "tune": cmd_tune, "demo": cmd_demo}[args.command](args)
    except CapCalError as err:
        _out(f"capcal: error: {err}", sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
