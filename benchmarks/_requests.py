"""The cost commands' measurements of one request (``python -m benchmarks.cost --slots`` and ``--prompts``).

``--slots`` (llama.cpp): one step's 14 node prompts on a server of its own, pinned to the slot that holds the prompt
or spread over idle slots. ``--prompts`` (vLLM): requests of 1 to 16 prompts, each a cached prefix and one fresh
token, the prefix ending 1, 16 or 31 tokens past a cache block (the tokens each prompt computes again, since the
prefix cache keeps whole blocks only): what a prompt of a lazy step costs beside the request that carries it.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import time
import urllib.request
from typing import Any

from benchmarks import _common as C

PROMPTS = (1, 2, 4, 8, 16)  # prompts a request
TAILS = (1, 16, 31)  # tokens past the last whole cache block
REPEATS = 3


def salted(passages: list[str]) -> list[str]:
    """The passages with one fresh salt: no prompt of them is cached from anything before."""
    salt = f" ({random.randrange(10 ** 12)})"
    return [p + salt for p in passages]


def one_server(unified: bool, query: str, passages: list[str], model: str) -> dict[str, Any]:
    """``--slots``: one step's 14 node prompts on a llama.cpp server of its own (8 slots, 2 threads, ``kv_unified`` as
    given), pinned to the slot that holds the prompt (what the library sends) and spread over idle slots (one batch)."""
    import xllamacpp as xlc

    from capcal_integrations.server.models import model_path

    def post(path: str, body: dict) -> Any:
        with urllib.request.urlopen(urllib.request.Request(url + path, json.dumps(body).encode(),
                                                           {"Content-Type": "application/json"}), timeout=3600) as a:
            return json.load(a)

    def timed(prompts: list[list[int]], **extra: Any) -> float:
        started = time.perf_counter()
        post("/v1/completions", {"prompt": prompts, "max_tokens": 1, "logprobs": 20, "temperature": 0, **extra})
        return round(time.perf_counter() - started, 3)

    p = xlc.CommonParams()
    p.model.path = str(model_path(model))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        p.hostnames, p.port = ["127.0.0.1"], free.getsockname()[1]
    p.n_parallel, p.n_ctx, p.n_batch, p.kv_unified = 8, 4096 * 8, 512, unified
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = 2
    server, url = xlc.Server(p), f"http://127.0.0.1:{p.port}"  # noqa: F841 - alive while the process is
    text = (f"Rank these passages for the query: {query}\n" + "\n".join(
        f"[{i + 1}] {x}" for i, x in enumerate(salted(passages))) + "\nRanking: [")
    ids = post("/tokenize", {"content": text})["tokens"]
    digit = [post("/tokenize", {"content": str(d)})["tokens"][0] for d in range(10)]
    nodes = [[], [digit[1]], [digit[2]], *([digit[1], digit[d]] for d in range(10)), [digit[2], digit[0]]]
    return {"kv_unified": unified, "prompt_tokens": len(ids), "nodes": len(nodes),
            "cold_prefill_s": timed([ids], id_slot=0), "pinned_s": timed([ids + n for n in nodes], id_slot=0),
            "pinned_again_s": timed([ids + n for n in nodes], id_slot=0),
            "spread_8_cold_s": timed([ids + n for n in nodes[:8]]), "spread_8_warm_s": timed([ids + n for n in nodes[:8]]),
            "pinned_8_s": timed([ids + n for n in nodes[:8]], id_slot=0)}


def slots(args: argparse.Namespace, lists: list[Any], stamp: dict) -> dict:
    import multiprocessing

    rows = []
    for unified in (False, True):  # a process each: xllamacpp's server lives until its process ends
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            rows.append(pool.apply(one_server, (unified, lists[0].query, list(lists[0].passages)[:args.passages],
                                                args.model)))
    return {"name": args.name or "slots", "stamp": stamp, "title": "One trie node's cost on llama.cpp, pinned or spread",
            "notes": ["Seconds; one DL19 list, a fresh salt (cold); the packaged model on llama.cpp, 8 slots, 2 threads."],
            "tables": [{"columns": ["kv_unified", "prompt tokens", "cold prefill", "nodes pinned", "again",
                                    "per node pinned", "8 nodes spread, cold", "8 spread, warm", "per node spread",
                                    "8 nodes pinned"],
                        "rows": [["on" if r["kv_unified"] else "off", r["prompt_tokens"], r["cold_prefill_s"],
                                  r["pinned_s"], r["pinned_again_s"], round(r["pinned_again_s"] / r["nodes"], 3),
                                  r["spread_8_cold_s"], r["spread_8_warm_s"], round(r["spread_8_warm_s"] / 8, 3),
                                  r["pinned_8_s"]] for r in rows]}], "data": {"rows": rows}}


def prompts(args: argparse.Namespace, lists: list[Any], stamp: dict) -> dict:
    """``--prompts``: a request's time against its prompts, per tail past the cache block (module docstring)."""
    import httpx

    from capcal_integrations.server.vllm import CPU_BLOCK_SIZE

    if args.engine != "vllm":
        raise SystemExit("--prompts measures vLLM's prefix cache (whole blocks only): add --engine vllm "
                         "(with --base-url, a vLLM server on a CPU)")
    block, b = CPU_BLOCK_SIZE, lists[0]
    with C.server(args.base_url, args.model, args.engine) as ep:
        http = httpx.Client(base_url=ep.base_url.rstrip("/").removesuffix("/v1"), timeout=3600,
                            headers={"Authorization": f"Bearer {ep.api_key or args.api_key or 'x'}"})

        def post(path: str, body: dict) -> Any:
            return http.post(path, json={"model": ep.model or "local", **body}).raise_for_status().json()

        text = f"Rank these passages for the query: {b.query}\n" + "\n".join(
            f"[{i + 1}] {x}" for i, x in enumerate(salted(list(b.passages)[:args.passages])))
        ids = post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
        rows, points = [], []
        for tail in TAILS:
            prefix = ids[:(len(ids) - tail) // block * block + tail]
            post("/v1/completions", {"prompt": [prefix], "max_tokens": 1})  # its whole blocks cached
            row: list[Any] = [tail, len(prefix)]
            for n in PROMPTS:
                times = []
                for _ in range(REPEATS):
                    batch = [prefix + [random.choice(ids)] for _ in range(n)]
                    started = time.perf_counter()
                    post("/v1/completions", {"prompt": batch, "max_tokens": 1, "logprobs": 1, "temperature": 0,
                                             "return_tokens_as_token_ids": True})
                    times.append(time.perf_counter() - started)
                    points.append((tail, n, times[-1]))
                row.append(round(1000 * statistics.median(times)))
            fit = statistics.linear_regression(PROMPTS, row[2:])  # the medians: one slow request does not tilt it
            rows.append([*row, round(fit.intercept), round(fit.slope, 1)])
    fit = statistics.linear_regression([n for _ in rows for n in PROMPTS], [ms for r in rows for ms in r[2:2 + len(PROMPTS)]])
    return {"name": args.name or "prompts", "stamp": stamp, "title": "A request's cost against the prompts it holds",
            "notes": [f"One DL19 list's passages (a fresh salt), {len(ids)} tokens, on {args.engine} "
                      f"(cache blocks of {block} tokens); each prompt the cached prefix and one fresh token; median of "
                      f"{REPEATS} requests, milliseconds. Over every tail: {fit.intercept:.0f} ms a request and "
                      f"{fit.slope:.1f} ms a prompt (least squares over the medians)."],
            "tables": [{"columns": ["tokens past the last block", "prefix tokens", *(f"{n} prompts" for n in PROMPTS),
                                    "fit: ms a request", "fit: ms a prompt"], "rows": rows}],
            "data": {"points": points}}
