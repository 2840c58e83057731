"""``capcal testbed``: measure the library's methods on the simulated reranker (:mod:`.measure`).

    capcal testbed --data ../shared/data/trec-dl19-passage --s 0,0.5,1,2 --draws 20 --json testbed.json
    capcal testbed --data ../shared/data/trec-dl19-passage --shape windows --scenario shared-slots --s 0,1

says how long it will take (a few lists timed), then prints a table (scenario, s, method, nDCG@10, reads
share) and writes it as JSON rows ``{"scenario", "s", "method", "ndcg10", "reads_share"}`` (and ``"shape"``
for a shape other than ``fixed``). ``--shape`` is how the lists reach the reranker (:data:`.measure.SHAPES`:
``fixed``, ``mixed`` lengths 3..30, sliding ``windows`` over 50..100 candidates, ``concurrent`` 8 at a time;
comma-separated or ``all``), ``--scenario`` the simulated model (:data:`.model.SCENARIOS`; ``all``).
``default`` is what the default options do; ``reads_share`` the share of its content decisions that said the
model reads. A test instrument: the numbers say what the library's rules do on a model with known signal and
bias, not what a real model does.
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
    names = list(SCENARIOS) if raw.strip() == "all" else [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return names


def _shapes(raw: str) -> list[str]:
    from .measure import SHAPES

    names = list(SHAPES) if raw.strip() == "all" else [x.strip() for x in raw.split(",") if x.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {', '.join(unknown)}; choose from {', '.join(SHAPES)} or all")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="capcal testbed", description=(
        "Rank a data folder's lists through a simulated reranker with known content signal s and known slot "
        "bias, and print nDCG@10 and the content decisions of every method. A test instrument: it shows what "
        "the library's rules do, not what a real model does."))
    ap.add_argument("--data", required=True, help="dataset directory (candidates.jsonl.gz + qrels.txt)")
    ap.add_argument("--s", type=_floats, default=[0.0, 0.5, 1.0, 2.0], help="content slopes (default 0,0.5,1,2)")
    ap.add_argument("--draws", type=int, default=5, help="simulated models (noise seeds) per scenario and s")
    ap.add_argument("--scenarios", "--scenario", type=_names, default=list(SCENARIOS), metavar="NAMES",
                    help=f"of {', '.join(SCENARIOS)}, comma-separated, or all (default all)")
    ap.add_argument("--shape", type=_shapes, default=["fixed"], metavar="SHAPES",
                    help="how the lists reach the reranker: fixed (the top 20, one after another), mixed (lengths "
                         "3..30), windows (50..100 candidates, sliding window), concurrent (8 lists at a time); "
                         "comma-separated or all (default fixed)")
    ap.add_argument("--lists", type=int, default=None, help="use the first N lists only")
    ap.add_argument("--top", type=int, default=None,
                    help="candidates loaded per list (default what the shape needs: 20, mixed 30, windows 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--estimate-only", action="store_true", help="say how long it would take, and stop")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capcal testbed`` with ``argv`` (without the program and command names); the exit status."""
    from .measure import SHAPE_TOP, bench_lists, estimate, measure, table

    args = parser().parse_args(argv)
    if args.draws < 1:
        raise InputError(f"--draws must be >= 1, got {args.draws}")
    logging.getLogger("capcal_integrations").setLevel(logging.WARNING)  # the library's per-list notes
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731, T201
    loaded = {top: bench_lists(args.data, top)[:args.lists] for top in {args.top or SHAPE_TOP[s] for s in args.shape}}
    runs = [(shape, loaded[args.top or SHAPE_TOP[shape]]) for shape in args.shape]
    total = 0.0
    for shape, lists in runs:
        seconds, per_list = estimate(lists, scenarios=args.scenarios, s_values=args.s, draws=args.draws, shape=shape,
                                     seed=args.seed)
        total += seconds
        say(f"{shape}: {len(lists)} lists x {args.draws} draws x {len(args.scenarios)} scenarios x {len(args.s)} s, about "
            f"{_duration(seconds)} (" + ", ".join(f"{m} {v * 1000:.0f} ms" for m, v in per_list.items() if v > 1e-4)
            + " per list, timed on a few lists)")
    if len(runs) > 1:
        say(f"in all about {_duration(total)}")
    if args.estimate_only:
        return 0
    start = time.perf_counter()
    progress = None if args.quiet else say
    rows = [r for shape, lists in runs for r in measure(lists, scenarios=args.scenarios, s_values=args.s, draws=args.draws,
                                                       seed=args.seed, progress=progress, shape=shape)]
    print(table(rows))  # noqa: T201
    print(f"\n{', '.join(f'{s}: {len(x)} lists' for s, x in runs)}; {args.draws} draws per scenario and s, "  # noqa: T201
          f"{time.perf_counter() - start:.0f} s (estimated {total:.0f} s). "
          "A test instrument: what the library's rules do on a simulated reranker, not what a real model does.")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.json() for r in rows], f, indent=1)
            f.write("\n")
    return 0


def _duration(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"2.5 h"``.

    >>> _duration(40), _duration(720), _duration(9000)
    ('40 s', '12 min', '2.5 h')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
