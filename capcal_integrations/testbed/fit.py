"""Fit the testbed's slot effects from a model's recorded first decoding steps.

A benchmark records file (``records.jsonl`` of ``capcal eval``) holds, for every list ranked by
``first-token-capcal``, the first step's renormalised distributions over the identifiers: ``p`` for the
real prompt and ``q`` for the empty (placeholder) prompt, slot by slot, the passages in their BM25
order. With the list's relevance grades ``g`` this fits, by least squares on a balanced panel (every
list has every slot):

* the slot prior ``b(slot)``: ``log q[i, j] = c_i + b_j + e`` (``c_i`` absorbs each list's
  normalisation), ``b`` centred to mean zero;
* the content slope ``s`` and the real-vs-empty slot mismatch ``delta(slot)``:
  ``log p[i, j] - log q[i, j] = c'_i + s * g[i, j] + delta_j + e'``, ``delta`` centred;
* the residual standard deviations of both (the noise of the empty and of the real stream, in logits).

Run ``python -m capcal_integrations.testbed.fit`` to rewrite ``slot_effects.json`` beside this module
from the packaged models' records (the command line names the files). It only reads files.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

__all__ = ["SlotFit", "first_steps", "fit", "two_way"]

#: The method whose records carry the first step of both streams over the whole BM25-ordered list.
METHOD = "first-token-capcal:guard=None"


@dataclass(frozen=True)
class SlotFit:
    """One model's fitted slot effects (logits; slot 0 is identifier ``[1]``)."""

    model: str
    lists: int
    prior: tuple[float, ...]  # b(slot), mean zero
    delta: tuple[float, ...]  # delta(slot), mean zero
    s: float  # content slope per relevance grade, real minus empty
    s_se: float  # its standard error (residual variance / the grades' within variance)
    noise_empty: float  # residual SD of log q around c_i + b_j
    noise_real: float  # residual SD of log p - log q around c'_i + s g + delta_j


def first_steps(records: str | pathlib.Path, grades: Mapping[str, Mapping[str, int]], method: str = METHOD
                ) -> list[tuple[list[float], list[float], list[int]]]:
    """``(p, q, grades)`` per recorded list (slot order), from the ``rank`` records of ``method``."""
    out = []
    with open(records, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            step = r.get("first_step")
            if r.get("kind") != "rank" or r.get("method") != method or r.get("variant") or not step or not step["q"]:
                continue
            docs = [r["input"][c] for c in step["candidates"]]
            out.append((step["p"], step["q"], [grades.get(r["qid"], {}).get(d, 0) for d in docs]))
    return out


def two_way(y: Sequence[Sequence[float]], x: Sequence[Sequence[float]] | None = None
            ) -> tuple[float, list[float], float, float]:
    """Least squares ``y[i][j] = c_i + slope * x[i][j] + e_j + noise`` on a balanced panel: the slope
    (0 without ``x``), the column effects ``e`` (mean zero), the residual SD and the slope's standard error.

    >>> slope, e, sd, _ = two_way([[1.0, 2.0, 4.0], [3.0, 4.0, 5.0]], [[0, 0, 1], [0, 0, 0]])
    >>> round(slope, 6), [round(v, 6) for v in e], round(sd, 6)
    (1.0, [-1.0, 0.0, 1.0], 0.0)
    """
    rows, cols = len(y), len(y[0])
    x = x or [[0.0] * cols for _ in range(rows)]

    def within(m: Sequence[Sequence[float]]) -> list[list[float]]:
        row = [math.fsum(r) / cols for r in m]
        col = [math.fsum(m[i][j] for i in range(rows)) / rows for j in range(cols)]
        total = math.fsum(row) / rows
        return [[m[i][j] - row[i] - col[j] + total for j in range(cols)] for i in range(rows)]

    wy, wx = within(y), within(x)
    sxx = math.fsum(v * v for r in wx for v in r)
    slope = math.fsum(a * b for ra, rb in zip(wy, wx) for a, b in zip(ra, rb)) / sxx if sxx else 0.0
    col_y = [math.fsum(y[i][j] for i in range(rows)) / rows for j in range(cols)]
    col_x = [math.fsum(x[i][j] for i in range(rows)) / rows for j in range(cols)]
    effects = [cy - slope * cx for cy, cx in zip(col_y, col_x)]
    centre = math.fsum(effects) / cols
    residual = [a - slope * b for ra, rb in zip(wy, wx) for a, b in zip(ra, rb)]
    dof = max(1, rows * cols - rows - cols + 1 - (1 if sxx else 0))
    var = math.fsum(v * v for v in residual) / dof
    return slope, [e - centre for e in effects], math.sqrt(var), math.sqrt(var / sxx) if sxx else 0.0


def fit(model: str, steps: Sequence[tuple[Sequence[float], Sequence[float], Sequence[int]]]) -> SlotFit:
    """The slot effects of one model from its recorded first steps (:func:`first_steps`)."""
    floor = 1e-12
    log_q = [[math.log(max(v, floor)) for v in q] for _, q, _ in steps]
    diff = [[math.log(max(a, floor)) - lq for a, lq in zip(p, row)] for (p, _, _), row in zip(steps, log_q)]
    _, prior, noise_empty, _ = two_way(log_q)
    s, delta, noise_real, s_se = two_way(diff, [[float(g) for g in grades] for _, _, grades in steps])
    return SlotFit(model, len(steps), tuple(round(v, 4) for v in prior), tuple(round(v, 4) for v in delta),
                   round(s, 4), round(s_se, 4), round(noise_empty, 4), round(noise_real, 4))


def main(argv: Sequence[str] | None = None) -> int:
    here = pathlib.Path(__file__).resolve().parent
    root = here.parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qrels", default="/work/shared/data/trec-dl19-passage/qrels.txt")
    ap.add_argument("--records", nargs=2, action="append", metavar=("NAME", "RECORDS"),
                    help="a model's name and its records.jsonl (repeatable)")
    ap.add_argument("--out", default=str(here / "slot_effects.json"))
    args = ap.parse_args(argv)
    records = args.records or [
        ("0.5b", str(root / "benchmarks/results/trec-dl19-passage/records.jsonl")),
        ("1.5b", str(root / "benchmarks/results/trec-dl19-passage@1.5b/records.jsonl"))]
    grades: dict[str, dict[str, int]] = {}
    with open(args.qrels, encoding="utf-8") as f:
        for line in f:
            qid, _, docid, grade = line.split()
            grades.setdefault(qid, {})[docid] = int(grade)
    fits = {name: asdict(fit(name, first_steps(path, grades))) for name, path in records}
    text = json.dumps({"source": {name: pathlib.Path(path).relative_to(root).as_posix() if pathlib.Path(path).is_relative_to(root)
                                  else path for name, path in records}, "method": METHOD, "fits": fits}, indent=1)
    pathlib.Path(args.out).write_text(text + "\n", encoding="utf-8")
    for name, f in fits.items():
        print(f"{name}: {f['lists']} lists, s = {f['s']:.3f} +- {f['s_se']:.3f}, noise empty {f['noise_empty']:.2f}, "  # noqa: T201
              f"real {f['noise_real']:.2f}, delta range {min(f['delta']):.2f}..{max(f['delta']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
