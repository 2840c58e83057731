"""How exactly a hosted chat API's answers give the first-step identifier distribution.

    python benchmarks/hosted_exactness.py --data ../shared/data/trec-dl19-passage --queries 5 [--server-url URL]

One llama.cpp server with assistant prefill off (started here unless ``--server-url``), asked two
ways: directly (its templated prompt lists read every identifier after an empty prefix: the
reference) and through ``HostedGateway("chat")`` (the generation transport reads the first identifier
of the model's answer from token texts, top-20). Both compute the trie form. Per DL19 query (BM25
top-20), ``first-token``: the largest gap in first-step probability over all 20 identifiers, over
``[3]``..``[9]`` (no other identifier shares their first digit), and per window of nine
(``window=9, stride=4``: every identifier one token). Writes ``benchmarks/results/hosted-exactness.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.evaluation.data import load_dataset  # noqa: E402
from capcal_integrations.server import EmbeddedServer, HostedGateway  # noqa: E402

HERE = pathlib.Path(__file__).parent
OPTIONS = {"method": "first-token", "guard": None, "probability": "trie"}


def _gaps(hosted, reference) -> list[tuple[int, list[float]]]:
    """Per window whose candidates agree: the absolute gaps of the first-step probabilities."""
    return [(h.window, [abs(a - b) for a, b in zip(h.p, r.p)])
            for h, r in zip(hosted.steps, reference.steps) if h.candidates == r.candidates]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--server-url")
    ap.add_argument("--out", default=str(HERE / "results" / "hosted-exactness.md"))
    args = ap.parse_args()
    data = load_dataset(args.data).select(args.queries)
    rows = []
    with contextlib.ExitStack() as stack:
        url = args.server_url or stack.enter_context(EmbeddedServer(model="0.5b", prefill=False)).base_url
        gateway = stack.enter_context(HostedGateway(url, "chat"))
        direct = CapCalReranker(base_url=url, **OPTIONS)
        hosted = CapCalReranker(base_url=gateway.base_url, api_key="x", **OPTIONS)
        for topic in data.topics:
            docs = [c.document() for c in topic.candidates[:20]]
            one_h, one_r = hosted.rerank(topic.query, docs), direct.rerank(topic.query, docs)
            [(_, gaps)] = _gaps(one_h, one_r)
            labels = [c + 1 for c in one_h.steps[0].candidates]
            nine_h = hosted.with_options(window=9, stride=4).rerank(topic.query, docs)
            nine_r = direct.with_options(window=9, stride=4).rerank(topic.query, docs)
            windows = _gaps(nine_h, nine_r)
            rows.append({"qid": topic.qid, "all": max(gaps), "single": max(g for g, k in zip(gaps, labels) if 3 <= k <= 9),
                         "estimated": one_h.upper_bounds, "nine": max(max(g) for _, g in windows),
                         "windows": f"{len(windows)} of {len({s.window for s in nine_h.steps})}",
                         "nine_estimated": nine_h.upper_bounds})
            print(rows[-1], flush=True)
    lines = [f"# First-step identifier probabilities: a hosted chat API's answers against the prefix transport "
             f"({time.strftime('%Y-%m-%d')})", "", f"Command: `python {' '.join(sys.argv)}`", "",
             __doc__.split("\n\n", 2)[2].replace("\n", " "), "",
             "| query | window 20: max gap, all 20 | max gap, [3]..[9] | estimated labels | windows of 9: max gap | "
             "windows compared | estimated labels |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['qid']} | {r['all']:.4f} | {r['single']:.4f} | {r['estimated']} | {r['nine']:.4f} | {r['windows']} | "
              f"{r['nine_estimated']} |" for r in rows]
    lines += ["", f"Means: window 20 all {statistics.fmean(r['all'] for r in rows):.4f}, [3]..[9] "
              f"{statistics.fmean(r['single'] for r in rows):.4f}; windows of 9 {statistics.fmean(r['nine'] for r in rows):.4f}.",
              "", "\"windows compared\": windows whose passages agree between the two (the first always does; later "
              "ones follow from the earlier windows' orders). \"estimated labels\": `Ranking.upper_bounds`."]
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
