"""``capcal testbed``: measure the library's methods on the simulated reranker (:mod:`.measure`).

    capcal testbed --data ../shared/data/trec-dl19-passage --s 0,0.5,1,2 --draws 20 --json testbed.json

prints a table (scenario, s, method, nDCG@10, reads share) and writes it as JSON rows
``{"scenario", "s", "method", "ndcg10", "reads_share"}``. ``default`` is what the default options do;
``reads_share`` the share of its content decisions that said the model reads. A test instrument: the
numbers say what the library's rules do on a model with known signal and bias, not what a real model does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

from ..errors import InputError
from .model import SCENARIOS

__all__ = ["main", "parser"]


def _floats(raw: str) -> list[float]:
    try:
        return [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {raw!r}") from None


def _names(raw: str) -> list[str]:
    names = [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="capcal testbed", description=(
        "Rank a data folder's lists through a simulated reranker with known content signal s and known slot "
        "bias, and print nDCG@10 and the content decisions of every method. A test instrument: it shows what "
        "the library's rules do, not what a real model does."))
    ap.add_argument("--data", required=True, help="dataset directory (candidates.jsonl.gz + qrels.txt)")
    ap.add_argument("--s", type=_floats, default=[0.0, 0.5, 1.0, 2.0], help="content slopes (default 0,0.5,1,2)")
    ap.add_argument("--draws", type=int, default=5, help="simulated models (noise seeds) per scenario and s")
    ap.add_argument("--scenarios", type=_names, default=list(SCENARIOS), help=f"of {', '.join(SCENARIOS)} (default all)")
    ap.add_argument("--lists", type=int, default=None, help="use the first N lists only")
    ap.add_argument("--top", type=int, default=20, help="candidates per list (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capcal testbed`` with ``argv`` (without the program and command names); the exit status."""
    from .measure import bench_lists, measure, table

    args = parser().parse_args(argv)
    if args.draws < 1:
        raise InputError(f"--draws must be >= 1, got {args.draws}")
    lists = bench_lists(args.data, args.top)[:args.lists]
    logging.getLogger("capcal_integrations").setLevel(logging.WARNING)  # the library's per-list notes
    start = time.perf_counter()
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))  # noqa: T201
    rows = measure(lists, scenarios=args.scenarios, s_values=args.s, draws=args.draws, seed=args.seed, progress=progress)
    print(table(rows))  # noqa: T201
    print(f"\n{len(lists)} lists x {args.draws} draws per scenario and s, {time.perf_counter() - start:.0f} s. "  # noqa: T201
          "A test instrument: what the library's rules do on a simulated reranker, not what a real model does.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.json() for r in rows], f, indent=1)
            f.write("\n")
    return 0
