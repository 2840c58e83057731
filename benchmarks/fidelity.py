"""Is it the method the authors released? The ``release`` preset against the CapCal authors' own code, query by query.

    python -m benchmarks.fidelity --smoke                  # 2 queries, the committed rankings: no server, seconds
    python -m benchmarks.fidelity crosscheck               # rank the official run's queries again, and compare
    python -m benchmarks.fidelity crosscheck --records benchmarks/results/quality/records/trec-dl19-passage/records.jsonl
    TORCH_VENV/bin/python -m benchmarks.fidelity official --release-code CODE --data ../shared/data/trec-dl19-passage
    python -m benchmarks.fidelity lazy --lists 10 [--engine vllm]   # lazy capcal against the whole reading, live
    python -m benchmarks.fidelity lazy --testbed --lists 50         # the same on the testbed's scenarios: no server
    TORCH_VENV/bin/python -m benchmarks.fidelity first-step --release-code CODE --data ../shared/data/trec-dl19-passage
    python -m benchmarks.fidelity first-step               # the library's first step, against the release's record
    python -m benchmarks.fidelity first-step --smoke       # the committed first-step records compared again: seconds
    python -m benchmarks.fidelity first-step --compare     # the same, into the results

``official`` runs, in a venv with torch and transformers, the release's own code (``USTC-StarTeam/CapCal`` at
:data:`RELEASE_COMMIT`, its ``code/`` directory kept outside this repository) on CPU, its methods called unchanged
on one model loaded once by its own ``LLMExp_StateMachine.load_model()``: ``vanilla`` (``get_passage_generation``,
constrained ``[i] > [j]`` decoding), ``fixed`` (``get_passage_logits_apply_bias_correction``, rate 1.0) and
``adaptive`` (``LLMExp_DynamicBias``'s, the entropy-based rate per step), on the packaged Qwen2.5-Coder-0.5B
converted to Hugging Face weights (``--dtype float32``: what the release's ``from_pretrained`` did under
transformers 4.x). Each query's first ``--depth`` candidates are shown as ``clean_passage(passage_text(doc),
None)`` (the ``release`` preset sends the passages as given: the two differ where a passage holds an identifier
look-alike such as ``[1]``, in 4 passages of query 573724); the placeholder is the release's command-line default.
It writes ``results/fidelity/records/official.json`` after every ranking (needs torch, transformers, numpy and
PyYAML).

``crosscheck`` ranks the same candidates with ``CapCalReranker(preset="release")`` on the embedded llama.cpp server
(the same model, Q4_K_M weights; ``--engine vllm``: on vLLM, with the official run's own Hugging Face weights,
``CAPCAL_VLLM_DTYPE=float32`` for its arithmetic; ``first-step`` takes the same option), or takes the library's
rankings from the quality command's records (``--records``, the ``dl19-release`` phase; they keep only the first
step's scores, so the margin is shown where the two orders part at rank 1), and reports per query and variant both
orders, Kendall tau, whether they are identical and, where they are not, the library's margin at the first step
where they part (a small margin is a near-tie that the weights' quantisation can flip).

``first-step`` compares the first decoding step label by label (p, q and the calibrated scores at rate 1.0, the
prompts' bytes and token ids), the release's (``--release-code``, torch) against the preset's: :mod:`._release_code`.

``lazy`` ranks each DL19 list with ``method="capcal"`` (``guard=None``, adaptive and fixed strength) lazily (middle
steps ask only the trie nodes that certify their choice) and whole (every node, ``testing.every_node``), on the same
server: identical orders, where they part the step and how far the lazy choice is below the whole reading's best,
and the nodes (prompts) each asked, counted from the requests: :mod:`._lazy`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time
from typing import Any

from benchmarks import _common as C
from benchmarks._lazy import add_arguments, lazy
from benchmarks._release_code import (
    MAX_DEPTH,
    PLACEHOLDER,
    RELEASE_COMMIT,
    RELEASE_REPO,
    add_subcommand,
    first_step,
    load_release,
    release_digests,
)
from capcal_integrations import CapCalReranker
from capcal_integrations.evaluation.data import Topic, load_dataset
from capcal_integrations.prompts.render import clean_passage, passage_text
from capcal_integrations.ranking.orders import kendall_tau
from capcal_integrations.types import Step

OFFICIAL = C.RESULTS / "fidelity" / "records" / "official.json"
#: The official variants as library options (on top of ``preset="release"``), and as the quality command's specs.
VARIANTS = {"vanilla": {"method": "vanilla"}, "fixed": {"method": "capcal", "alpha": 1.0},
            "adaptive": {"method": "capcal", "alpha": "adaptive"}}
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
             save: Any, engine: str = "llamacpp") -> list[dict[str, Any]]:
    """Rank what ``done`` lacks, calling ``save(rows)`` after each ranking (a stopped run resumes)."""
    topics = {t.qid: t for t in load_dataset(data).topics}
    finished = {(r["qid"], r["variant"]) for r in done}
    todo = [row for row in official["rows"] if (row["qid"], row["variant"]) not in finished]
    if not todo:
        return done
    with C.server(url, "0.5b", engine) as ep:
        rr = CapCalReranker(base_url=ep.base_url, api_key=ep.api_key, model=ep.model, timeout=900, preset="release")
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


def passages_of(topic: Topic, depth: int) -> list[str]:
    """The strings both sides show: the first ``depth`` candidates, cleaned as this library does."""
    return [clean_passage(passage_text(c.document()), None) for c in topic.candidates[:depth]]


def _read_out(path: pathlib.Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows already written, after checking they were made with the same settings."""
    if not path.is_file():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    for key in ("release_commit", "model_dir", "model_dtype", "data", "depth", "placeholder", "release_sha256"):
        if old.get(key) != meta[key]:
            raise SystemExit(f"{path} was made with {key}={old.get(key)!r}, not {meta[key]!r}: use another --out")
    return old["rows"]


def run_of(record: dict, name: str, stamp: dict) -> dict[str, Any]:
    rows, o = record["rows"], record["official"]
    summary = [[v, len(these), f"{sum(r['identical'] for r in these)} / {len(these)}",
                f"{sum(r['tau'] for r in these) / len(these):.3f}"]
               for v in VARIANTS if (these := [r for r in rows if r["variant"] == v])]
    body = []
    for r in rows:
        margin = "–"
        if "margin" in r:
            margin = f"{r['margin']:+.4f} ({r['score_library_pick']:.4f} vs {r['score_official_pick']:.4f})"
            if "margin_percentile" in r:
                margin += f"; smaller than {1 - r['margin_percentile']:.0%} of the ranking's step margins"
        body.append([r["qid"], r["variant"], "yes" if r["identical"] else "no", f"{r['tau']:.3f}",
                     "–" if r.get("first_difference") is None else r["first_difference"] + 1, margin,
                     " ".join(str(i + 1) for i in r["official"]), " ".join(str(i + 1) for i in r["library"]),
                     f"{r['official_seconds']:.0f} / {r['library_seconds']:.0f}"])
    return {"name": name, "stamp": stamp, "title": "The `release` preset against the CapCal authors' code",
            "notes": [f"Official: `{o['release_repo']}` at `{o['release_commit']}` on CPU (torch {o['torch']}, "
                      f"transformers {o['transformers']}), the packaged Qwen2.5-Coder-0.5B-Instruct as {o['model_dtype']} "
                      "Hugging Face weights. Library: `CapCalReranker(preset=\"release\")` on the embedded "
                      f"{record.get('library_server', 'llama.cpp server, the same model as Q4_K_M weights')}, rankings "
                      f"{record['library_rankings']}. Data: "
                      f"{o['data']}, the first {o['depth']} BM25 candidates, placeholder \"{o['placeholder']}\".",
                      "The margin: the library's release score of its own pick minus that of the official pick, at the "
                      "first rank where the two differ, against the gaps between the best and second-best score at each "
                      "of its steps: a margin smaller than most is a near-tie, which the weights (fp32 against Q4_K_M) "
                      "can flip." if "library_server" not in record else "of its steps (here both sides read the same "
                      "weights in float32: a difference is the inputs', or the arithmetic's on a near-tie)."],
            "tables": [{"columns": ["variant", "queries", "identical rankings", "mean Kendall tau"], "rows": summary},
                       {"columns": ["query", "variant", "identical", "Kendall tau", "first difference (rank)",
                                    "library's margin there", "official (1-based)", "library (1-based)",
                                    "seconds: official / library"], "rows": body}],
            "data": record}


def official(args: argparse.Namespace) -> None:
    """Run the release's code: every (query, variant) not yet in ``--out``, written after each."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    topics = load_dataset(args.data).select(args.queries).topics
    log_dir = tempfile.mkdtemp(prefix="capcal-release-")
    start = time.perf_counter()
    fixed, adaptive = load_release(args, log_dir)
    print(f"loaded {args.model_dir} ({fixed.model.dtype}) in {time.perf_counter() - start:.1f} s; log in {log_dir}")
    meta = {"release_repo": RELEASE_REPO, "release_commit": RELEASE_COMMIT,
            "release_sha256": release_digests(args.release_code), "model_dir": args.model_dir,
            "model_dtype": str(fixed.model.dtype), "data": args.data.name, "depth": args.depth,
            "placeholder": PLACEHOLDER, "bias_rate": 1.0, "threads": args.threads, "torch": torch.__version__,
            "transformers": transformers.__version__}
    rows = _read_out(args.out, meta)
    done = {(r["qid"], r["variant"]) for r in rows}
    calls = {"vanilla": lambda q, p: fixed.get_passage_generation(q, p),
             "fixed": lambda q, p: fixed.get_passage_logits_apply_bias_correction(q, p, 1.0),
             "adaptive": lambda q, p: adaptive.get_passage_logits_apply_bias_correction(q, p, 1.0)}
    for topic in topics:
        passages, docids = passages_of(topic, args.depth), [c.docid for c in topic.candidates[:args.depth]]
        for variant in (v for v in args.variants.split(",") if (topic.qid, v) not in done):
            start = time.perf_counter()
            order = [i - 1 for i in calls[variant](topic.query, passages)]  # the release answers 1-based labels
            rows.append({"qid": topic.qid, "variant": variant, "order": order, "docids": [docids[i] for i in order],
                         "seconds": round(time.perf_counter() - start, 2),
                         "permutation": sorted(order) == list(range(len(passages)))})
            C.write_json(args.out, {**meta, "rows": rows})
            print(f"{topic.qid} {variant:<8} {rows[-1]['seconds']:7.1f} s  {order}", flush=True)


def _shown(path: str) -> str:
    p = pathlib.Path(path).resolve()
    return str(p.relative_to(C.ROOT)) if p.is_relative_to(C.ROOT) else path


def main(argv: list[str] | None = None) -> int:
    ap = C.parser("fidelity", __doc__)
    sub = ap.add_subparsers(dest="what")
    cc = C.subcommand(sub, "crosscheck", "the library against the official rankings (the default)")
    cc.add_argument("--official", default=str(OFFICIAL))
    cc.add_argument("--data", help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    cc.add_argument("--url", help="a running server with the 0.5B model (default: start one)")
    cc.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"),
                    help="the embedded server: llama.cpp (Q4_K_M) or vLLM with the official run's Hugging Face weights "
                         "(CAPCAL_VLLM_DTYPE=float32 for its arithmetic)")
    cc.add_argument("--records", help="take the library's rankings from this records file")
    cc.add_argument("--queries", type=int, help="the official run's first N queries only")
    off = C.subcommand(sub, "official", "run the authors' release code (in a venv with torch and transformers)")
    off.add_argument("--release-code", required=True, type=pathlib.Path, help="the release's code/ (src/llm_utils.py)")
    off.add_argument("--model-dir", default="~/.cache/capcal/qwen2.5-coder-0.5b-instruct-q4_k_m-hf")
    off.add_argument("--data", required=True, type=pathlib.Path, help="a dataset folder in the shared format")
    off.add_argument("--queries", type=int, default=10, help="the first N queries, in file order")
    off.add_argument("--depth", type=int, default=20, choices=range(1, MAX_DEPTH + 1), metavar="1-20")
    off.add_argument("--variants", default=",".join(VARIANTS))
    off.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    off.add_argument("--dtype", choices=("float32", "auto"), default="float32")
    off.add_argument("--verbose", action="store_true", help="also show the release's INFO log on the console")
    add_subcommand(sub)
    lz = C.subcommand(sub, "lazy", "lazy capcal against the whole reading on a real server")
    add_arguments(lz)
    args = ap.parse_args(argv)
    if args.what == "lazy":
        print(f"wrote {C.save('fidelity', lazy(args, C.stamp('fidelity', argv)), C.out_dir('fidelity', args))}")
        return 0
    if args.what == "first-step":
        return first_step(args, argv, OFFICIAL)
    if args.what == "official":
        args.model_dir = str(pathlib.Path(args.model_dir).expanduser().resolve())
        args.release_code, args.out = args.release_code.resolve(), pathlib.Path(args.out or OFFICIAL)
        official(args)
        return 0
    if args.what is None:
        args = cc.parse_args([], namespace=args)
    if args.smoke:  # the committed rankings of the first 2 queries: no server
        args.records = args.records or str(C.RESULTS / "quality/records/trec-dl19-passage/records.jsonl")
        args.queries = 2
    stamp, out = C.stamp("fidelity", argv), C.out_dir("fidelity", args)
    given = json.loads(pathlib.Path(args.official).read_text())
    qids = list(dict.fromkeys(r["qid"] for r in given["rows"]))[:args.queries]
    given["rows"] = [r for r in given["rows"] if r["qid"] in qids]
    record = {"library_rankings": f"from `{_shown(args.records)}`" if args.records else "ranked by this command",
              "official": {k: v for k, v in given.items() if k != "rows"}, "rows": []}
    name = args.name or ("crosscheck-records" if args.records else "crosscheck" + ("-vllm" if args.engine == "vllm" else ""))
    if args.engine == "vllm" and not args.records:
        from capcal_integrations.server.vllm import default_dtype

        record["library_server"] = f"vLLM server, the official run's Hugging Face weights served as {default_dtype()}"
    if args.records:
        record["rows"] = from_records(given, pathlib.Path(args.records))
    else:
        def save(rows: list[dict[str, Any]]) -> None:
            C.save("fidelity", run_of({**record, "rows": rows}, name, stamp), out)

        before = next((r["data"]["rows"] for r in C.load("fidelity", out)["runs"] if r["name"] == name), [])
        data = pathlib.Path(args.data) if args.data else C.need_data("trec-dl19-passage")
        record["rows"] = rank_all(given, data, args.url, before, save, args.engine)
    print(f"wrote {C.save('fidelity', run_of(record, name, stamp), out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
