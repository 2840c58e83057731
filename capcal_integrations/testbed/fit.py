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

From several readings of the same list in different orders (the records' ``shuffle`` variants of a list
beside its ``rank`` record, or a JSON of first-step readings as given and with the halves swapped:
``benchmarks/results/decisions/records/decision-sampling-1.5b.json``) it splits the real prompt's list x slot variation, by the
method of moments on the residuals ``z`` of ``log p`` (each reading centred, the slot means over all
readings removed), into

* ``shared_slots``: effects of (list, slot) that every reading of the list shares, whatever passage sits
  there: the covariance of two readings of a list slot by slot;
* ``noise_passage``: effects that follow the passage (content, taste): the covariance passage by passage;
* ``noise_fresh``: the rest, fresh in every prompt (the total variance minus both);

and the spread of the lists' own noise: ``noise_scale``, the SD of the log of each list's noise SD (the
spread of a list's readings around their slot means), less the part a list's finite number of slots
explains (``1 / (2 df)``). The SDs are corrected for the centring (``n / (n - 1)``; the slot means over
``L`` lists take ``1 / L`` of the shared variance).

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

__all__ = ["SlotFit", "first_steps", "fit", "two_way", "reorderings", "paired_readings", "shared_fit"]

Reorder = list[tuple[list[float], list[str]]]  # one list's readings: (log p per slot, the passage in each slot)

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


def reorderings(records: str | pathlib.Path, method: str = METHOD) -> list[Reorder]:
    """Every list read in more than one order: its ``rank`` and ``shuffle`` records of ``method``, as
    ``(log p per slot, docid per slot)``."""
    by: dict[str, Reorder] = {}
    with open(records, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            step = r.get("first_step")
            if r.get("kind") not in ("rank", "shuffle") or r.get("method") != method or not step:
                continue
            by.setdefault(r["qid"], []).append(([math.log(max(v, 1e-12)) for v in step["p"]],
                                                [r["input"][c] for c in step["candidates"]]))
    return [v for v in by.values() if len(v) > 1]


def _halves(n: int) -> list[int]:
    """The swapped reading's order of the saved readings: slot ``j`` shows passage ``perm[j]``, halves traded."""
    h = n // 2
    return [*range(h, 2 * h), *range(h), *range(2 * h, n)]


def paired_readings(path: str | pathlib.Path) -> list[Reorder]:
    """The readings of a JSON whose ``readings`` are ``[given, swapped]`` first-step log-probabilities per list
    (``benchmarks/results/decisions/records/decision-sampling-1.5b.json``): the given order and the halves swapped."""
    stored = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    out = []
    for given, swapped in stored["readings"]:
        n = len(given)
        out.append([(list(given), [str(i) for i in range(n)]), (list(swapped), [str(i) for i in _halves(n)])])
    return out


def shared_fit(lists: Sequence[Reorder]) -> dict[str, float]:
    """``shared_slots``, ``noise_passage``, ``noise_fresh`` and ``noise_scale`` of the real prompt's list x slot
    variation from lists read in several orders (see the module docstring), with how many lists and readings."""
    n = len(lists[0][0][0])
    lists = [rs for rs in lists if all(len(lp) == n for lp, _ in rs)]
    rows = [[[v - math.fsum(lp) / n for v in lp] for lp, _ in rs] for rs in lists]
    count = sum(len(r) for r in rows)
    mean = [math.fsum(z[j] for r in rows for z in r) / count for j in range(n)]
    resid = [[[z[j] - mean[j] for j in range(n)] for z in r] for r in rows]
    total, slot, passage = [], [], []
    log_sd, dof = [], []
    for z, rs in zip(resid, lists):
        total += [v * v for zr in z for v in zr]
        for a in range(len(z)):
            at_a = {p: j for j, p in enumerate(rs[a][1])}
            for b in range(a + 1, len(z)):
                at_b = {p: j for j, p in enumerate(rs[b][1])}
                slot += [x * y for x, y in zip(z[a], z[b])]
                passage += [z[a][at_a[p]] * z[b][at_b[p]] for p in at_a]
        k = len(z)  # the list's spread: its readings around their mean, slot by slot
        centre = [math.fsum(zr[j] for zr in z) / k for j in range(n)]
        df = (k - 1) * (n - 1)
        log_sd.append(0.5 * math.log(math.fsum((zr[j] - centre[j]) ** 2 for zr in z for j in range(n)) / df))
        dof.append(df)
    lists_n, c = len(lists), n / (n - 1)
    shared2 = max(0.0, math.fsum(slot) / len(slot) * c * lists_n / (lists_n - 1))
    passage2 = max(0.0, math.fsum(passage) / len(passage) * c)
    fresh2 = max(0.0, (math.fsum(total) / len(total) * c - shared2 * (1 - 1 / lists_n)) / (1 - 1 / count) - passage2)
    centre = math.fsum(log_sd) / lists_n
    spread = math.fsum((v - centre) ** 2 for v in log_sd) / (lists_n - 1) - math.fsum(1 / (2 * d) for d in dof) / lists_n
    sds = sorted(math.exp(v) for v in log_sd)
    median = sds[lists_n // 2] if lists_n % 2 else (sds[lists_n // 2 - 1] + sds[lists_n // 2]) / 2
    return {"shared_slots": round(math.sqrt(shared2), 4), "noise_passage": round(math.sqrt(passage2), 4),
            "noise_fresh": round(math.sqrt(fresh2), 4), "noise_scale": round(math.sqrt(max(0.0, spread)), 4),
            "noise_max_over_median": round(sds[-1] / median, 4), "reordered_lists": lists_n,
            "readings_per_list": round(count / lists_n, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    here = pathlib.Path(__file__).resolve().parent
    root = here.parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qrels", default="/work/shared/data/trec-dl19-passage/qrels.txt")
    ap.add_argument("--records", nargs=2, action="append", metavar=("NAME", "RECORDS"),
                    help="a model's name and its records.jsonl (repeatable)")
    ap.add_argument("--readings", nargs=2, action="append", metavar=("NAME", "JSON"),
                    help="a model's first-step readings as given and halves swapped (decision_sampling.py's JSON) for "
                         "its shared slot effects; without, the records' shuffled lists (repeatable)")
    ap.add_argument("--out", default=str(here / "slot_effects.json"))
    args = ap.parse_args(argv)
    records = args.records or [
        ("0.5b", str(root / "benchmarks/results/quality/records/trec-dl19-passage/records.jsonl")),
        ("1.5b", str(root / "benchmarks/results/quality/records/trec-dl19-passage@1.5b/records.jsonl"))]
    paired = dict(args.readings or [("1.5b", str(root / "benchmarks/results/decisions/records/decision-sampling-1.5b.json"))])
    grades: dict[str, dict[str, int]] = {}
    with open(args.qrels, encoding="utf-8") as f:
        for line in f:
            qid, _, docid, grade = line.split()
            grades.setdefault(qid, {})[docid] = int(grade)
    def shown(path: str) -> str:
        return pathlib.Path(path).relative_to(root).as_posix() if pathlib.Path(path).is_relative_to(root) else path

    fits, shared_source = {}, {}
    for name, path in records:
        fits[name] = asdict(fit(name, first_steps(path, grades)))
        reordered = paired_readings(paired[name]) if name in paired else reorderings(path)
        shared_source[name] = shown(paired[name]) + " (given and halves swapped)" if name in paired else (
            shown(path) + " (the rank and shuffle records of the lists read in several orders)")
        if reordered:
            fits[name].update(shared_fit(reordered))
    text = json.dumps({"source": {name: shown(path) for name, path in records}, "shared_source": shared_source,
                       "method": METHOD, "fits": fits}, indent=1)
    pathlib.Path(args.out).write_text(text + "\n", encoding="utf-8")
    for name, f in fits.items():
        print(f"{name}: {f['lists']} lists, s = {f['s']:.3f} +- {f['s_se']:.3f}, noise empty {f['noise_empty']:.2f}, "  # noqa: T201
              f"real {f['noise_real']:.2f}, delta range {min(f['delta']):.2f}..{max(f['delta']):.2f}; "
              f"shared slots {f.get('shared_slots')}, fresh {f.get('noise_fresh')}, passage {f.get('noise_passage')}, "
              f"noise scale {f.get('noise_scale')} ({f.get('reordered_lists')} lists read in several orders)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
