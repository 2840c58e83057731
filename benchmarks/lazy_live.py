"""Lazy capcal against the whole reading on a real server: the same prompts, the same answers, step by step.

For each BM25 list of a collection (its first ``--passages``), ``method="capcal"`` (``guard=None``) ranks the list
whole (every node of both streams, :func:`capcal_integrations.testing.every_node`), each prompt's answer recorded,
then lazily (middle steps ask only the trie nodes that certify their choice, ``reading/certified.py``), each prompt
it asks answered from that record (:class:`Replay`; a prompt not in it, such as a wanted token asked again at a
larger top-k, goes to the server). So the lazy reading sees the model's own numbers, exactly the whole reading's,
and any order that differs is the certificate's fault, not the server's drift between two batches. With the
adaptive strength and with a fixed strength of 1. Reported: identical orders; where the orders part, the step
where they part and how far the lazy choice is below the whole reading's best there (calibrated score); nodes
(prompts) asked per list, both streams, counted from the requests, and the prompts the record could not answer.

    python benchmarks/lazy_live.py --data ../shared/data/trec-dl19-passage [--lists 10] [--passages 20]
        [--engine vllm] [--base-url URL]

writes ``benchmarks/results/lazy-live[-vllm].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any

import httpx
import openai

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.testbed.endpoint import _prompt_list  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists  # noqa: E402
from capcal_integrations.testing import every_node  # noqa: E402


class Replay(httpx.BaseTransport):
    """An HTTP transport that records each completions prompt's answer (``recording``) and answers a prompt it has
    a record of from it (same prompt, same top-k), sending only the others on to the server."""

    def __init__(self) -> None:
        self.inner, self.record, self.recording, self.missed = httpx.HTTPTransport(), {}, True, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/v1/completions"):
            return self.inner.handle_request(request)
        body = json.loads(request.content)
        prompts = _prompt_list(body["prompt"])
        keys = [json.dumps([p, body.get("logprobs")]) for p in prompts]
        todo = list(range(len(keys))) if self.recording else [k for k, key in enumerate(keys) if key not in self.record]
        if todo:
            sent = {**body, "prompt": [prompts[k] for k in todo]}
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            answer = self.inner.handle_request(httpx.Request("POST", request.url, headers=headers, json=sent))
            answer.read()
            if answer.status_code != 200:
                return answer
            for k, choice in zip(todo, sorted(answer.json()["choices"], key=lambda c: c["index"])):
                self.record[keys[k]] = choice
            self.missed += 0 if self.recording else len(todo)
        choices = [{**self.record[key], "index": i} for i, key in enumerate(keys)]
        return httpx.Response(200, json={"object": "text_completion", "model": body.get("model"), "choices": choices,
                                         "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


def _prompts(sent: list[httpx.Request]) -> int:
    """Prompts (trie nodes) in the recorded requests: each prompt of a completions prompt list, each chat request."""
    return sum(len(_prompt_list(json.loads(r.content)["prompt"])) if r.url.path.endswith("/v1/completions")
               else r.url.path.endswith("/chat/completions") for r in sent)


def compare(rr: CapCalReranker, replay: Replay, sent: list[httpx.Request], query: str, passages: list[str],
            alpha: Any) -> dict:
    lazy_rr = rr.with_options(method="capcal", alpha=alpha)
    out: dict[str, Any] = {"alpha": alpha}
    replay.record.clear()
    for name in ("whole", "lazy"):
        sent.clear()
        replay.recording, replay.missed = name == "whole", 0
        if name == "lazy":
            ranking = lazy_rr.rerank(query, passages)
        else:
            with every_node(lazy_rr) as whole_rr:
                ranking = whole_rr.rerank(query, passages)
        out[f"nodes_{name}"] = _prompts(sent)
        out[name] = ranking
    out["not_in_record"] = replay.missed
    lazy, whole = out.pop("lazy"), out.pop("whole")
    out["identical"] = lazy.order == whole.order
    out["pruned_steps"] = sum(s.pruned > 0 for s in lazy.steps)
    out["steps"] = len(lazy.steps)
    out["parted_at"] = out["gap"] = None
    for k, (a, b) in enumerate(zip(lazy.steps, whole.steps)):
        if a.chosen != b.chosen:
            out["parted_at"] = k
            out["gap"] = max(b.scores) - b.scores[b.candidates.index(a.chosen)]
            break
    return out


def markdown(rows: list[dict], info: dict) -> str:
    lines = ["# Lazy capcal against the whole reading, live", "",
             f"`{info['command']}` on {info['server']} ({info['model']}), commit {info['commit']}, {info['machine']}, "
             f"{info['date']}.", "",
             "Each list ranked by capcal (`guard=None`) twice: whole (every trie node of both streams, each prompt's "
             "answer recorded) and lazy (middle steps certified by bounds), each prompt the lazy reading asks answered "
             "from that record (the same numbers: a differing order would be the certificate's, not the server's "
             "drift). *parted*: the step where the two choices first differ and how far the lazy choice's calibrated "
             "score is below the whole reading's best there.", "",
             "| alpha | lists | identical orders | parted (step: gap) | middle steps certified early | nodes / list, "
             "lazy | nodes / list, whole | lazy / whole | lazy prompts not in the record |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for alpha in dict.fromkeys(r["alpha"] for r in rows):
        rs = [r for r in rows if r["alpha"] == alpha]
        parted = ", ".join(f"{r['parted_at']}: {r['gap']:.3f}" for r in rs if r["parted_at"] is not None) or "none"
        nl, nw = (sum(r[f"nodes_{k}"] for r in rs) / len(rs) for k in ("lazy", "whole"))
        lines.append(f"| {alpha} | {len(rs)} | {sum(r['identical'] for r in rs)} | {parted} | "
                     f"{sum(r['pruned_steps'] for r in rs)} / {sum(r['steps'] - 2 for r in rs)} | {nl:.0f} | {nw:.0f} | "
                     f"{nl / nw:.2f} | {sum(r['not_in_record'] for r in rs)} |")
    lines += ["", "What a lazy list costs in seconds, cold, is `floor.py`'s; here the lazy reading's answers come from "
              "the record.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--lists", type=int, default=10)
    ap.add_argument("--passages", type=int, default=20)
    ap.add_argument("--alphas", default="adaptive,1.0", help="strengths, comma-separated (default %(default)s)")
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--model", default="0.5b")
    ap.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from capcal_integrations.server.launcher import endpoint

    out = pathlib.Path(args.out or HERE / "results" / ("lazy-live" + ("-vllm" if args.engine == "vllm" else "")))
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"command": "python benchmarks/lazy_live.py " + " ".join(sys.argv[1:]), "commit": commit,
            "machine": f"{platform.machine()}, {platform.system()}, {__import__('os').cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d")}
    rows = []
    with endpoint(args.base_url, args.model, engine=args.engine) as ep:
        sent: list[httpx.Request] = []
        replay = Replay()
        http = httpx.Client(transport=replay, event_hooks={"request": [sent.append]}, timeout=3600)
        client = openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key or "x", http_client=http, max_retries=0)
        rr = CapCalReranker(client=client, model=ep.model, guard=None)
        caps = rr.capabilities()
        info |= {"server": caps.server or caps.kind.name, "model": caps.model}
        for k, b in enumerate(bench_lists(args.data)[:args.lists]):
            for alpha in (a if a == "adaptive" else float(a) for a in args.alphas.split(",")):
                row = compare(rr, replay, sent, b.query, list(b.passages)[:args.passages], alpha)
                rows.append({"list": k, **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            out.with_suffix(".json").write_text(json.dumps({**info, "rows": rows}, indent=1) + "\n")
            out.with_suffix(".md").write_text(markdown(rows, info))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
