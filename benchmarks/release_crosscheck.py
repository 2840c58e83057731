"""Cross-check: the library's ``release`` preset against the CapCal authors' own code, query by query.

    .venv/bin/python benchmarks/release_crosscheck.py            # rank, compare, write the record
    .venv/bin/python benchmarks/release_crosscheck.py --records benchmarks/results/trec-dl19-passage/records.jsonl
        # -> results/release-crosscheck/crosscheck-records.{json,md}
    .venv/bin/python benchmarks/release_crosscheck.py --report-only

``--records`` takes the library's rankings from the benchmark's ``dl19-release`` phase (the same
preset on the same candidates) instead of ranking again; those records keep only the first step's
scores, so the margin is shown where the two orders part at rank 1.

Reads the official rankings written by ``benchmarks/release_official.py`` (the release's code run on
CPU with the packaged Qwen2.5-Coder-0.5B converted to Hugging Face weights, computed in float32), ranks the same
candidates with ``CapCalReranker(preset="release")`` on the embedded llama.cpp server (the same
model, Q4_K_M weights), and writes ``results/release-crosscheck/crosscheck.{json,md}``: per query and
variant, both orders, Kendall tau, whether they are identical and, where they are not, the first
step where they part and the library's margin there between its pick and the official one (a small
margin is a near-tie that the weights' quantisation can flip).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset  # noqa: E402
from capcal_integrations.evaluation.markdown import table  # noqa: E402
from capcal_integrations.ranking.orders import kendall_tau  # noqa: E402
from capcal_integrations.types import Step  # noqa: E402

OUT = HERE / "results" / "release-crosscheck"
#: The official variants as library options (on top of ``preset="release"``).
VARIANTS = {"vanilla": {"method": "vanilla"}, "fixed": {"method": "capcal", "alpha": 1.0},
            "adaptive": {"method": "capcal", "alpha": "adaptive"}}


#: The benchmark's spec of each variant (``--records``).
SPECS = {"vanilla": "vanilla:preset=release", "fixed": "capcal:alpha=1.0,preset=release",
         "adaptive": "capcal:preset=release"}


def compare(official: list[int], ours: list[int], steps: list[Step]) -> dict[str, Any]:
    """Agreement of two orders of one list, and the library's margin where they first part."""
    row: dict[str, Any] = {"library": ours, "identical": ours == official, "tau": round(kendall_tau(ours, official), 4)}
    if ours == official:
        return row
    k = next(i for i, (a, b) in enumerate(zip(ours, official)) if a != b)
    row["first_difference"] = k
    gaps = sorted(_gap(s.scores) for s in steps if len(s.scores) > 1)
    if k < len(steps):
        step = steps[k]
        score = dict(zip(step.candidates, step.scores))
        if gaps:  # how this margin compares with the ranking's decisions: the top-1 vs top-2 gap of every step
            row["margin_percentile"] = round(sum(g <= score[ours[k]] - score[official[k]] for g in gaps) / len(gaps), 3)
        mine, theirs = score[ours[k]], score[official[k]]
        row.update(score_library_pick=round(mine, 6), score_official_pick=round(theirs, 6),
                   margin=round(mine - theirs, 6), relative_margin=round((mine - theirs) / abs(mine), 4) if mine else None)
    return row


def rank_all(official: dict, data: pathlib.Path, url: str | None, done: list[dict[str, Any]],
             save: Any) -> list[dict[str, Any]]:
    """Rank what ``done`` lacks, calling ``save(rows)`` after each ranking (a stopped run resumes)."""
    topics = {t.qid: t for t in load_dataset(data).topics}
    finished = {(r["qid"], r["variant"]) for r in done}
    todo = [row for row in official["rows"] if (row["qid"], row["variant"]) not in finished]
    if not todo:
        return done
    server = None
    if url is None:
        from capcal_integrations.server import EmbeddedServer

        server = EmbeddedServer(model="0.5b", port=8097, threads=2).start()
        url = server.base_url
    try:
        rr = CapCalReranker(base_url=url, timeout=900, preset="release")
        rows = list(done)
        for row in todo:
            topic = topics[row["qid"]]
            docs = [c.document() for c in topic.candidates[:official["depth"]]]
            assert [docs[i].id for i in row["order"]] == row["docids"], "the official run ranked other candidates"
            start = time.perf_counter()
            ranking = rr.with_options(**VARIANTS[row["variant"]]).rerank(topic.query, docs)
            rows.append({"qid": row["qid"], "variant": row["variant"], "official": row["order"],
                         "official_seconds": row["seconds"], "library_seconds": round(time.perf_counter() - start, 2),
                         **compare(row["order"], list(ranking.order), list(ranking.steps))})
            print(f"{row['qid']} {row['variant']}: tau {rows[-1]['tau']:.3f} identical {rows[-1]['identical']}",
                  flush=True)
            save(rows)
        return rows
    finally:
        if server is not None:
            server.stop()


def _gap(scores: tuple[float, ...]) -> float:
    top = sorted(scores, reverse=True)
    return top[0] - top[1]


def from_records(official: dict, records: pathlib.Path) -> list[dict[str, Any]]:
    """The comparison with the library's rankings as the benchmark stored them."""
    stored = {}
    for line in records.read_text().splitlines():
        r = json.loads(line)
        stored[(r["qid"], r["method"])] = r
    rows = []
    for row in official["rows"]:
        rec = stored.get((row["qid"], SPECS[row["variant"]]))
        if rec is None:
            continue
        assert [rec["input"][i] for i in row["order"]] == row["docids"], "the official run ranked other candidates"
        ours = [rec["input"].index(d) for d in rec["order"]]
        first = rec.get("first_step") or {}
        steps = [Step(tuple(first["candidates"]), tuple(first["p"]), None, tuple(first["s"]), 0.0, 0.0, ours[0])
                 ] if first else []
        rows.append({"qid": row["qid"], "variant": row["variant"], "official": row["order"],
                     "official_seconds": row["seconds"], "library_seconds": rec["seconds"],
                     **compare(row["order"], ours, steps)})
    return rows


def report(record: dict) -> str:
    rows = record["rows"]
    head = ["query", "variant", "identical", "Kendall τ", "first difference (rank)", "library's margin there",
            "official (1-based)", "library (1-based)", "seconds: official / library"]
    body = []
    for r in rows:
        margin = "–"
        if "margin" in r:
            margin = f"{r['margin']:+.4f} ({r['score_library_pick']:.4f} vs {r['score_official_pick']:.4f})"
            if "margin_percentile" in r:
                margin += f"; smaller than {1 - r['margin_percentile']:.0%} of the ranking's step margins"
        body.append([r["qid"], r["variant"], "yes" if r["identical"] else "no", f"{r['tau']:.3f}",
                     "–" if r.get("first_difference") is None else str(r["first_difference"] + 1),
                     margin, " ".join(str(i + 1) for i in r["official"]), " ".join(str(i + 1) for i in r["library"]),
                     f"{r['official_seconds']:.0f} / {r['library_seconds']:.0f}"])
    summary = []
    for variant in VARIANTS:
        these = [r for r in rows if r["variant"] == variant]
        if these:
            same = sum(r["identical"] for r in these)
            summary.append([variant, str(len(these)), f"{same} / {len(these)}",
                            f"{sum(r['tau'] for r in these) / len(these):.3f}"])
    return "\n".join([
        "# The `release` preset against the CapCal authors' code\n",
        f"_Generated by `benchmarks/release_crosscheck.py` on {record['generated']}._\n",
        f"- official: `{record['official']['release_repo']}` at `{record['official']['release_commit']}`, run by "
        f"`benchmarks/release_official.py` on CPU (torch {record['official']['torch']}, transformers "
        f"{record['official']['transformers']}), the packaged Qwen2.5-Coder-0.5B-Instruct converted to "
        f"{record['official']['model_dtype']} Hugging Face weights;",
        "- library: `CapCalReranker(preset=\"release\")` on the embedded llama.cpp server, the same model as "
        f"Q4_K_M weights; rankings {record.get('library_rankings', 'ranked by this script')};",
        f"- data: {record['official']['data']}, the first {record['official']['depth']} BM25 candidates, "
        f"placeholder \"{record['official']['placeholder']}\".\n",
        "The margin is the library's release score (raw probability, calibrated for fixed/adaptive) of its own pick "
        "minus that of the official pick, at the first rank where the two differ, and how it compares with the margins "
        "of the library's own decisions in that ranking (the gap between its best and second-best score at each "
        "step): a margin smaller than most of them is a near-tie, which the different weights (fp32 against "
        "Q4_K_M) can flip.\n",
        table(["variant", "queries", "identical rankings", "mean Kendall τ"], summary) + "\n",
        table(head, body) + "\n",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official", default=str(OUT / "official.json"))
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--url", help="a running llama.cpp server with the 0.5B model (default: start one)")
    ap.add_argument("--records", help="take the library's rankings from this benchmark records file")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--name", help="output name (default: crosscheck, or crosscheck-records with --records)")
    a = ap.parse_args()
    name = a.name or ("crosscheck-records" if a.records else "crosscheck")
    path = OUT / f"{name}.json"
    if a.report_only:
        record = json.loads(path.read_text())
    else:
        official = json.loads(pathlib.Path(a.official).read_text())
        record = {"generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "library_rankings": f"from {a.records}" if a.records else "ranked by this script",
                  "official": {k: v for k, v in official.items() if k != "rows"}, "rows": []}

        def save(rows: list[dict[str, Any]]) -> None:
            record["rows"] = rows
            path.write_text(json.dumps(record, indent=1) + "\n")

        if a.records:
            save(from_records(official, pathlib.Path(a.records)))
        else:
            previous = json.loads(path.read_text()) if path.is_file() else {}
            done = previous.get("rows", []) if previous.get("library_rankings") == record["library_rankings"] else []
            save(rank_all(official, pathlib.Path(a.data), a.url, done, save))
    (OUT / f"{name}.md").write_text(report(record))
    print(OUT / f"{name}.md")


if __name__ == "__main__":
    main()
