"""What one trie node costs on llama.cpp's server, and whether its slots can share a prefix (issue 35).

A decoding step of the exact (``joint``) form asks the next-token distribution after every node of the identifier
trie: the prompt (about 2,300 tokens for a 20-passage DL19 list) plus 0-2 tokens of a partial identifier, 14-21
prompts a step. This measures, on the embedded llama.cpp server started here with the packaged 0.5B (8 slots,
2 threads), each way of sending one step's node prompts:

* **pinned**: one prompt list pinned to the slot that holds the prompt (what the library sends): the slot runs
  them one after another, each costing its last 1-2 tokens;
* **spread**: the same prompts unpinned, which llama.cpp runs in all its idle slots at once (one batch): cold,
  each slot computes the whole prompt; again, once every slot holds it, one batched forward for all of them;
* both with ``kv_unified`` off (llama.cpp's default, the library's server) and on (one KV buffer for all slots:
  does a slot reuse another slot's prefix?).

Writes ``benchmarks/results/slots.md`` and ``.json``.

    python benchmarks/slots.py --data ../shared/data/trec-dl19-passage
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.server.models import model_path  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists  # noqa: E402


def __free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as answer:
        return json.load(answer)


def _timed(url: str, prompts: list[list[int]], **extra: Any) -> float:
    started = time.perf_counter()
    _post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 1, "logprobs": 20, "temperature": 0, **extra})
    return round(time.perf_counter() - started, 3)


def one_server(unified: bool, query: str, passages: list[str], model: str) -> dict[str, Any]:
    """Start a server (``kv_unified`` as given) and time one step's node prompts each way."""
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = str(model_path(model))
    p.hostnames, p.port = ["127.0.0.1"], _free_port()
    p.n_parallel, p.n_ctx, p.n_batch, p.kv_unified = 8, 4096 * 8, 512, unified
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
    server = xlc.Server(p)  # noqa: F841 (kept alive for the measurement)
    url = f"http://127.0.0.1:{p.port}"
    salt = random.randrange(10 ** 12)  # cold: no earlier prompt shares this one
    text = (f"Rank these passages for the query: {query}\n"
            + "\n".join(f"[{i + 1}] {x} ({salt})" for i, x in enumerate(passages)) + "\nRanking: [")
    ids = _post(url, "/tokenize", {"content": text})["tokens"]
    digit = [_post(url, "/tokenize", {"content": str(d)})["tokens"][0] for d in range(10)]
    # 14 of the first step's 21 nodes below "[" (the root, "[1", "[2", "[10".."[19", "[20"; the exact form also asks
    # "[3".."[9" for their closing "]")
    nodes = [[], [digit[1]], [digit[2]], *([digit[1], digit[d]] for d in range(10)), [digit[2], digit[0]]]
    row: dict[str, Any] = {"kv_unified": unified, "prompt_tokens": len(ids), "nodes": len(nodes)}
    row["cold_prefill_s"] = _timed(url, [ids], id_slot=0)
    row["pinned_s"] = _timed(url, [ids + n for n in nodes], id_slot=0)
    row["pinned_again_s"] = _timed(url, [ids + n for n in nodes], id_slot=0)
    row["spread_8_cold_s"] = _timed(url, [ids + n for n in nodes[:8]])
    row["spread_8_warm_s"] = _timed(url, [ids + n for n in nodes[:8]])
    row["pinned_8_s"] = _timed(url, [ids + n for n in nodes[:8]], id_slot=0)
    return row


def _write(out: pathlib.Path, rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
    out.with_suffix(".json").write_text(json.dumps({**info, "rows": rows}, indent=1) + "\n")
    lines = ["# One trie node's cost on llama.cpp, pinned or spread over slots (issue 35)", "",
             f"`python benchmarks/slots.py --data {info['data']}` (commit {info['commit']}): the packaged "
             f"{info['model']} on the embedded llama.cpp server, 8 slots, 2 threads; one DL19 list's 20 passages "
             "(a fresh salt: cold). Seconds:", "",
             f"| kv_unified | prompt tokens | cold prefill | {rows[0]['nodes']} nodes pinned | again | per node pinned | "
             "8 nodes spread, "
             "cold | 8 spread, every slot holding the prompt | per node spread | 8 nodes pinned |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {'on' if r['kv_unified'] else 'off'} | {r['prompt_tokens']} | {r['cold_prefill_s']:.2f} | "
                     f"{r['pinned_s']:.2f} | {r['pinned_again_s']:.2f} | {r['pinned_again_s'] / r['nodes']:.3f} | "
                     f"{r['spread_8_cold_s']:.2f} | {r['spread_8_warm_s']:.2f} | {r['spread_8_warm_s'] / 8:.3f} | "
                     f"{r['pinned_8_s']:.2f} |")
    lines += ["", "Read: a node costs one forward pass of its last 1-2 tokens over the cached prompt. Pinned, a slot "
              "runs a step's nodes one after another; spread over slots that already hold the prompt, llama.cpp runs "
              "them in one batch (cheaper per node), but a slot that does not hold it computes the whole prompt "
              "(the cold spread: about one prefill per slot), and `kv_unified` does not let a slot reuse another "
              "slot's prefix. So on this server the exact form's cost per list is bounded below by its node count "
              "(about 230 nodes for a 20-passage list, decoded to the end) times the per-node time, while the trie "
              "form asks about 3 nodes a step."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a dataset folder, e.g. ../shared/data/trec-dl19-passage")
    ap.add_argument("--model", default="0.5b")
    ap.add_argument("--out", default=str(HERE / "results" / "slots"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"data": args.data, "model": args.model, "commit": commit}
    rows = []
    for unified in (False, True):  # each in a process of its own: xllamacpp's server lives until its process ends
        found = subprocess.run([sys.executable, __file__, "--one", str(int(unified)), "--data", args.data,
                                "--model", args.model], capture_output=True, text=True, check=True)
        rows.append(json.loads(found.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    _write(pathlib.Path(args.out), rows, info)
    print(pathlib.Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    if "--one" in sys.argv:
        k = sys.argv.index("--one")
        unified = sys.argv[k + 1] == "1"
        data = sys.argv[sys.argv.index("--data") + 1]
        model = sys.argv[sys.argv.index("--model") + 1]
        lst = bench_lists(data)[0]
        print(json.dumps(one_server(unified, lst.query, list(lst.passages)[:20], model)))
        raise SystemExit(0)
    raise SystemExit(main())
