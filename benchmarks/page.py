"""The results page, ``benchmarks/README.md``, regenerated from the five commands' JSON files; and the README's quotes.

    python -m benchmarks.page            # rewrite benchmarks/README.md and every results/<command>/<command>.md
    python -m benchmarks.page --check    # exit 1 if either is not what the JSON gives, or a README quote disagrees

Nothing on the page is typed by hand: per command its question, its command lines (from the module's docstring)
and, per run, the date, the commit and the headline table (the run's first table). :data:`QUOTES` are the numbers
the project's README quotes from a benchmark: each is formatted from its JSON cell and must appear in the README
as it is (tests/test_benchmark_results.py checks both, without the data or a server).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from typing import Any

from benchmarks import _common as C

PAGE = C.ROOT / "benchmarks" / "README.md"
README = C.ROOT / "README.md"


def cell(command: str, run: str, column: str, **where: str) -> str:
    """The cell of ``column`` in the headline table of ``run``, in the row whose columns equal ``where``."""
    found = [r for r in C.load(command)["runs"] if r["name"] == run]
    if not found:
        raise KeyError(f"{command}: no run {run!r}")
    t = found[0]["tables"][0]
    cols = t["columns"]
    for row in t["rows"]:
        if all(str(row[cols.index(k)]) == v for k, v in where.items()):
            return str(row[cols.index(column)])
    raise KeyError(f"{command}/{run}: no row {where}")


def found(command: str, run: str, pattern: str) -> str:
    """The first group of ``pattern`` in the run's notes and captions (a number a converted run states in prose)."""
    r = next(r for r in C.load(command)["runs"] if r["name"] == run)
    m = re.search(pattern, " ".join([*r.get("notes", []), *(t.get("caption", "") for t in r.get("tables", []))]))
    if m is None:
        raise KeyError(f"{command}/{run}: no {pattern!r}")
    return m.group(1)


def lead(x: str) -> str:
    """``0.4992`` as the README writes it: ``.4992``."""
    return x[1:] if x.startswith("0.") else x


def _peers(d: str, m: str) -> str:
    return lead(cell("peers", "bm25-top20", "nDCG@10", dataset=d, method=m))


def _repaired(d: str, m: str) -> tuple[str, str]:
    k, n = cell("peers", "bm25-top20", "outputs needing repair", dataset=d, method=m).split("/")
    return k, n


def _checked(d: str) -> int:
    rows = next(r for r in C.load("peers")["runs"] if r["name"] == "bm25-top20")["data"]["rows"]
    return sum(r["dataset"] == d and r["method"] == "capcal-default" and r.get("reading_requests", 0) > 0 for r in rows)


def _seconds(m: str) -> float:
    return float(cell("peers", "bm25-top20", "s / list", dataset="dl19", method=m))


#: (what the README must say, word for word once its line breaks are spaces): each built from the JSON.
QUOTES: list[tuple[str, Any]] = [
    ("peers, DL19", lambda: f"DL19 nDCG@10: BM25 {_peers('dl19', 'bm25')}, LlamaIndex's `RankGPTRerank` "
                            f"{_peers('dl19', 'llamaindex-rankgpt')}"),
    ("peers, DL19", lambda: "`RankGPTRerank` {} (its parser completed {} of {} answers)".format(
        _peers("dl19", "llamaindex-rankgpt"), *_repaired("dl19", "llamaindex-rankgpt"))),
    ("peers, DL19", lambda: "LangChain's `LLMListwiseRerank` {} ({} of {})".format(
        _peers("dl19", "langchain-listwise"), *_repaired("dl19", "langchain-listwise"))),
    ("peers, DL19", lambda: f"this library's `vanilla` {_peers('dl19', 'capcal-vanilla')}"),
    ("peers, SciFact", lambda: f"SciFact (abstracts cut to 100 words): BM25 {_peers('scifact', 'bm25')}, "
                               f"`RankGPTRerank` {_peers('scifact', 'llamaindex-rankgpt')}"),
    ("peers, SciFact", lambda: f"`LLMListwiseRerank` {_peers('scifact', 'langchain-listwise')}"),
    ("peers, SciFact", lambda: f"`vanilla` {_peers('scifact', 'capcal-vanilla')}"),
    ("peers, decided", lambda: f"decided after {_checked('dl19')} and {_checked('scifact')} lists"),
    ("cost, lazy vanilla", lambda: found("cost", "floor-lazy", r"`vanilla, every node` / vanilla's: median per list (\d\.\d+)")
     + "x faster since"),
    ("cost, one request", lambda: cell("cost", "floor-lazy", "time / generating", method="vanilla")
     + "x one request of RankGPT's prompt on one server"),
    ("peers, time", lambda: f"{_seconds('capcal-vanilla') / _seconds('llamaindex-rankgpt'):.1f}x RankGPT's time in that run"),
]


def quotes_disagreeing(readme: str | None = None) -> list[str]:
    """The quotes the README does not hold as the JSON gives them (an empty list: all agree)."""
    text = " ".join((readme if readme is not None else README.read_text()).split())
    return [f"{what}: README lacks {q}" for what, make in QUOTES if (q := make()) not in text]


def commands(command: str) -> list[str]:
    """The command lines a module's docstring shows (its smoke and full runs)."""
    doc = ast.get_docstring(ast.parse((C.ROOT / "benchmarks" / f"{command}.py").read_text())) or ""
    return [line.strip() for line in doc.splitlines() if re.match(r"\s+(\S+=\S+ )*\S*python -m benchmarks\.", line)]


def page() -> str:
    lines = ["# Benchmarks", "",
             "Generated by `python -m benchmarks.page` from `results/<command>/<command>.json`: do not edit by hand. "
             "Five commands, one a question; each writes one `.md` and one `.json` under `results/<command>/`, every "
             "run stamped with its commit, date, machine and exact command. A run marked *converted* was measured "
             "by an earlier script and carried over from its results file, not re-run. `--smoke` (2 short lists, "
             "written under a temporary folder) is what CI runs; the data is `../shared/data` beside the checkout. "
             "What the findings mean: [docs/benchmarks.md](../docs/benchmarks.md) and the docs it links.", ""]
    for command, question in C.QUESTIONS.items():
        result = C.load(command)
        lines += [f"## {command}: {question}", "", "```", *commands(command), "```", "",
                  f"All runs, with their notes and every table: [results/{command}/{command}.md]"
                  f"(results/{command}/{command}.md).", ""]
        for run in result["runs"]:
            s = run["stamp"]
            mark = f", *converted* from `{run['converted_from'].removeprefix('benchmarks/')}`" \
                if run.get("converted_from") else ""
            lines += [f"### {run['name']}: {run['title']}", "",
                      f"{s['date']}, commit {s['commit']}{mark}: `{s['command']}`", ""]
            if run.get("tables"):
                lines += C.table(run["tables"][0])
    return "\n".join(lines).rstrip() + "\n"


def stale() -> list[str]:
    """The generated files that are not what the JSON gives."""
    out = [] if PAGE.is_file() and PAGE.read_text() == page() else [str(PAGE)]
    for command in C.QUESTIONS:
        md = C.RESULTS / command / f"{command}.md"
        if md.is_file() and md.read_text() != C.render(C.load(command)):
            out.append(str(md))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.page", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything disagrees")
    args = ap.parse_args(argv)
    if args.check:
        problems = [f"not regenerated: {p}" for p in stale()] + quotes_disagreeing()
        print("\n".join(problems) or "the results page and the README's quotes agree with the JSON", file=sys.stderr)
        return 1 if problems else 0
    for command in C.QUESTIONS:
        if (C.RESULTS / command / f"{command}.json").is_file():
            (C.RESULTS / command / f"{command}.md").write_text(C.render(C.load(command)))
    PAGE.write_text(page())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
