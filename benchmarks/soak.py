"""A soak: thousands of rankings in one process through every route and adapter, on the test double (issue 51).

Each call picks, in turn, a route (``rerank``; ``arerank`` under ``asyncio.run`` per call; ``arerank`` on one
persistent event loop; the LlamaIndex adapter; the LangChain adapter), a dialect of the test double
(llama.cpp, vLLM, SGLang, Ollama) and one of ``--option-sets`` option sets (placeholders: each its own content
check on a model that does not read, so checks pile up past the registry's bound). The decisions folder is a
temporary one of this run's. After every ``--every`` calls it records the process's RSS, threads, open files and
the cache sizes of every endpoint state (checks kept, rendered templates, control tokens tested), and counts the
broken rankings (an error, or an order that is not a permutation of the passages).

Then ``--processes`` processes save decisions (each of its own model) in one decisions folder while the parent
SIGKILLs one at random ``--kills`` times and starts it again, reading the folder all along: it counts files torn
(unreadable), decisions lost (a process logged a save the folder no longer holds) and crossed (a file holding
another key than its name's).

Writes ``benchmarks/results/soak.md`` and ``soak.json``. No server, no model: anyone can rerun it.

    python benchmarks/soak.py [--calls 3000] [--every 1000] [--option-sets 24] [--processes 6] [--kills 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import pathlib
import random
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.content_check.decision import ContentDecision  # noqa: E402
from capcal_integrations.content_check.saved_decisions import Store, key_id  # noqa: E402
from capcal_integrations.testing import clients, make_handler  # noqa: E402

DIALECTS = {"llama.cpp": {}, "vllm": {"vllm": True}, "sglang": {"sglang": True}, "ollama": {"ollama": True}}
ROUTES = ("rerank", "asyncio.run", "persistent loop", "llamaindex", "langchain")
WORDS = "flea cat dog lives years water heat sun moon river stone tree bird fish grass cloud salt iron".split()


def _proc(name: str) -> int:
    """A field of /proc/self/status in kB (Linux), 0 where there is none."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _lists(k: int) -> list[tuple[str, list[str]]]:
    out = []
    for q in range(k):
        out.append((f"query {q} {WORDS[q % len(WORDS)]}",
                    [f"{WORDS[(q + i) % len(WORDS)]} {q}-{i} " + " ".join(WORDS[(q * i + j) % len(WORDS)] for j in range(8))
                     for i in range(8)]))
    return out


class Soak:
    def __init__(self, option_sets: int) -> None:
        self.rerankers = {}
        for name, flags in DIALECTS.items():
            sync, async_ = clients(make_handler(**flags))
            base = CapCalReranker(client=sync, async_client=async_, max_retries=0)
            self.rerankers[name] = [base.with_options(placeholder=f"[nothing {k}]") for k in range(option_sets)]
        self.loop = asyncio.new_event_loop()
        self.adapters = {}
        for module in ("llamaindex_ext", "langchain_ext"):
            try:
                ext = __import__(module)
            except ImportError:
                continue
            self.adapters[module] = {name: ext.CapCalRerank(reranker=rrs[0], top_n=8) for name, rrs in self.rerankers.items()}

    def call(self, k: int, query: str, passages: list[str]) -> bool:
        """One ranking; whether it is whole (an order that is a permutation of the passages)."""
        dialect = list(DIALECTS)[k % len(DIALECTS)]
        route = ROUTES[(k // len(DIALECTS)) % len(ROUTES)]
        rr = self.rerankers[dialect][(k // (len(DIALECTS) * len(ROUTES))) % len(self.rerankers[dialect])]
        if route == "rerank":
            order = rr.rerank(query, passages).order
        elif route == "asyncio.run":
            order = asyncio.run(rr.arerank(query, passages)).order
        elif route == "persistent loop":
            order = self.loop.run_until_complete(rr.arerank(query, passages)).order
        elif route == "llamaindex" and "llamaindex_ext" in self.adapters:
            from llama_index.core.schema import NodeWithScore, TextNode

            nodes = [NodeWithScore(node=TextNode(text=p, id_=str(i)), score=1.0) for i, p in enumerate(passages)]
            out = self.adapters["llamaindex_ext"][dialect].postprocess_nodes(nodes, query_str=query)
            order = tuple(int(n.node.id_) for n in out)
        elif route == "langchain" and "langchain_ext" in self.adapters:
            from langchain_core.documents import Document

            docs = [Document(page_content=p, metadata={"i": i}) for i, p in enumerate(passages)]
            order = tuple(d.metadata["i"] for d in self.adapters["langchain_ext"][dialect].compress_documents(docs, query))
        else:
            order = rr.rerank(query, passages).order
        return sorted(order) == list(range(len(passages))) or (route in ("llamaindex", "langchain")
                                                               and len(set(order)) == len(order) <= len(passages))

    def caches(self) -> dict[str, int]:
        states = {id(rrs[0]._state): rrs[0]._state for rrs in self.rerankers.values()}
        return {"checks": sum(len(s.content) for s in states.values()),
                "templates": sum(len(s.templates) for s in states.values()),
                "tested tokens": sum(len(s.tested) for s in states.values())}


class _Count(logging.Handler):
    """Counts the library's WARNINGs (the soak found 149 of 311 were reloaded decisions said again)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.n += 1


def run(calls: int, every: int, option_sets: int) -> dict:
    warnings = _Count()
    library = logging.getLogger("capcal_integrations")
    library.addHandler(warnings)
    library.propagate = False  # counted, not printed
    lists = _lists(40)
    soak = Soak(option_sets)
    rows, broken, errors, longest = [], 0, {}, 0.0
    start_rss = _proc("VmRSS")
    started = time.perf_counter()
    for k in range(calls):
        query, passages = lists[k % len(lists)]
        t = time.perf_counter()
        try:
            broken += not soak.call(k, query, passages)
        except Exception as err:  # noqa: BLE001 - counted and reported
            broken += 1
            errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1
        longest = max(longest, time.perf_counter() - t)
        if (k + 1) % every == 0 or k + 1 == calls:
            rows.append({"calls": k + 1, "rss_mb": round(_proc("VmRSS") / 1024, 1),
                         "rss_growth_mb": round((_proc("VmRSS") - start_rss) / 1024, 1),
                         "threads": threading.active_count(), "open_files": _open_files(), **soak.caches(),
                         "broken": broken, "warnings": warnings.n, "longest_s": round(longest, 3),
                         "seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    soak.loop.close()
    return {"calls": calls, "every": every, "option_sets": option_sets, "routes": list(ROUTES),
            "dialects": list(DIALECTS), "adapters": sorted(soak.adapters), "rows": rows, "broken": broken,
            "errors": errors}


def _decision(k: int, i: int) -> ContentDecision:
    return ContentDecision(True, "reads", 0.004, 250.0, 0.8, i, 1.0, 1.0, ((1.0, 0.3),),
                           (("model", f"model {k}"), ("weights", f"sha256:{k}")))


def _saver(folder: str, k: int, log: str) -> None:
    """Save decisions of model ``k`` forever, each logged after it is saved (a SIGKILL ends it)."""
    logging.getLogger("capcal_integrations").setLevel(logging.ERROR)
    store = Store(folder)
    done = [int(x) for x in open(log).read().split()] if os.path.exists(log) else []
    i = (done[-1] + 1) if done else 0
    with open(log, "a") as out:
        while True:
            if store.save(_decision(k, i)) is not None:
                out.write(f"{i}\n")
                out.flush()
            i += 1


def processes(n: int, kills: int) -> dict:
    """``n`` processes saving in one folder, one SIGKILLed and restarted ``kills`` times; torn, lost, crossed."""
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        folder = str(pathlib.Path(tmp) / "decisions")
        logs = [str(pathlib.Path(tmp) / f"saved-{k}.log") for k in range(n)]
        workers = [ctx.Process(target=_saver, args=(folder, k, logs[k]), daemon=True) for k in range(n)]
        for w in workers:
            w.start()
        torn = crossed = reads = 0
        for _ in range(kills):
            time.sleep(rng.uniform(0.02, 0.2))
            k = rng.randrange(n)
            workers[k].kill()
            workers[k].join()
            workers[k] = ctx.Process(target=_saver, args=(folder, k, logs[k]), daemon=True)
            workers[k].start()
            for saved in Store(folder).entries():
                reads += 1
                torn += saved.decision is None
                crossed += saved.decision is not None and key_id(saved.decision.key) != saved.id
        for w in workers:
            w.kill()
            w.join()
        lost = 0
        for k in range(n):
            logged = [int(x) for x in open(logs[k]).read().split()] if os.path.exists(logs[k]) else []
            kept = Store(folder).load(_decision(k, 0).key)
            lost += bool(logged) and (kept is None or kept.lists < logged[-1])
        temporaries = len(list(pathlib.Path(folder).glob(".*.tmp")))
    return {"processes": n, "kills": kills, "files_read": reads, "torn": torn, "lost": lost, "crossed": crossed,
            "temporaries_left": temporaries}


def report(result: dict) -> str:
    head = ["calls", "rss_mb", "rss_growth_mb", "threads", "open_files", "checks", "templates", "tested tokens",
            "broken", "warnings", "longest_s", "seconds"]
    lines = ["# Soak: rankings in one process on the test double (benchmarks/soak.py)", "",
             f"{result['calls']} calls through {', '.join(result['routes'])}; dialects {', '.join(result['dialects'])}; "
             f"{result['option_sets']} option sets each (content checks on a model that does not read); adapters "
             f"installed: {', '.join(result['adapters']) or 'none'}. Broken rankings: **{result['broken']}**"
             f"{' (' + json.dumps(result['errors']) + ')' if result['errors'] else ''}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in result["rows"]]
    many = result.get("many")
    if many:
        lines += ["", f"**Many processes**: {many['processes']} processes saving decisions in one folder, "
                  f"{many['kills']} SIGKILLs (each restarted); {many['files_read']} files read meanwhile: "
                  f"**{many['torn']} torn, {many['lost']} lost, {many['crossed']} crossed**; "
                  f"{many['temporaries_left']} temporary files left by the killed (removed by the next writer after "
                  "a minute)."]
    lines += ["", "Per row: the process after that many calls (RSS from /proc/self/status; threads alive; open file "
              "descriptors; checks kept over every endpoint state, at most 16 each; rendered templates; control tokens "
              "tested; the library's WARNINGs so far). Rerun: `python benchmarks/soak.py`.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--option-sets", type=int, default=24)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--out", default=str(HERE / "results" / "soak"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:  # readings may still be landing
        os.environ["CAPCAL_DECISIONS_DIR"] = str(pathlib.Path(folder) / "decisions")
        result = run(args.calls, args.every, args.option_sets)
    if args.processes:
        result["many"] = processes(args.processes, args.kills)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(result))
    print(report(result))
    many = result.get("many") or {}
    return 1 if result["broken"] or many.get("torn") or many.get("lost") or many.get("crossed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
