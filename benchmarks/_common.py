"""What the five benchmark commands share: the data, the stamp, and one results file per command.

Each command (``python -m benchmarks.<command>``) keeps its runs in ``benchmarks/results/<command>/<command>.json``
(a run replaces the run of the same name) and renders all of them to ``<command>.md`` beside it. A run is a dict:
``name``, ``title``, ``stamp`` (``commit``, ``date``, ``machine``, ``command``; a run converted from an older
results file also has ``converted_from``: that file, and the commit that last wrote it), ``notes`` (paragraphs),
``tables`` (each ``columns`` and ``rows``; the first is the run's headline) and any ``data`` of its own.
``--smoke`` runs write under a temporary folder, never over the committed results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The questions, one a command, in the order of the results page.
QUESTIONS = {
    "quality": "Does reranking beat the first stage: every method on the shared collections, and on the testbed "
               "whose truth is known?",
    "cost": "What does a list cost: time against the floor of the server and against one generating request, per "
            "endpoint kind and concurrency?",
    "decisions": "Does the default decide right: how often it calibrates a model that does not read, how fast it "
                 "sees one that does, from judged queries and on real models?",
    "fidelity": "Is the method the authors released: the `release` preset against their code, query by query?",
    "peers": "Beside the rerankers people use today (LlamaIndex, LangChain), on one server in one run?",
}


def data_dir() -> pathlib.Path | None:
    """The shared collections (``../shared/data`` beside the checkout), or None when absent."""
    for p in (ROOT.parent / "shared" / "data", pathlib.Path("/work/shared/data")):
        if p.is_dir():
            return p
    return None


def parser(command: str, doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks.{command}", description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="2 short lists, written under a temporary folder")
    ap.add_argument("--out", help=f"the results folder (default benchmarks/results/{command}; --smoke: a temporary one)")
    ap.add_argument("--name", help="the run's name in the results file (a run replaces the one of its name)")
    return ap


def subcommand(subparsers: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand that also takes ``--smoke``, ``--out`` and ``--name`` after its name."""
    sub = subparsers.add_parser(name, help=help)
    sub.add_argument("--smoke", action="store_true", default=argparse.SUPPRESS, help="2 short lists")
    for flag in ("--out", "--name"):
        sub.add_argument(flag, default=argparse.SUPPRESS, help="as before the subcommand")
    return sub


def need_data(sub: str = "") -> pathlib.Path:
    """The shared collections, or exit 0 with a clear message (a smoke run skips without them)."""
    d = data_dir()
    if d is None or (sub and not (d / sub).is_dir()):
        print(f"skipped: no ../shared/data{'/' + sub if sub else ''} beside the checkout", file=sys.stderr)
        raise SystemExit(0)
    return d / sub if sub else d


def stamp(command: str, argv: list[str] | None = None) -> dict[str, str]:
    """The commit (``-dirty`` with uncommitted changes), the UTC date, the machine and the exact command."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return {"commit": commit + ("-dirty" if dirty.stdout.strip() else ""),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, load {load:.1f}, Python "
                       f"{platform.python_version()}",
            "command": f"python -m benchmarks.{command} " + shlex.join(sys.argv[1:] if argv is None else argv)}


def out_dir(command: str, args: argparse.Namespace) -> pathlib.Path:
    if args.out:
        return pathlib.Path(args.out)
    if args.smoke:
        return pathlib.Path(tempfile.gettempdir()) / "capcal-smoke" / command
    return RESULTS / command


def load(command: str, folder: pathlib.Path | None = None) -> dict[str, Any]:
    path = (folder or RESULTS / command) / f"{command}.json"
    if path.is_file():
        return json.loads(path.read_text())
    return {"command": command, "question": QUESTIONS[command], "runs": []}


def write_json(path: pathlib.Path, value: Any) -> None:
    """``value`` as indented JSON at ``path`` (its folder made), replaced whole: a run cut short leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def save(command: str, run: dict[str, Any], folder: pathlib.Path) -> pathlib.Path:
    """Add ``run`` (replacing the run of its name) to the command's .json and rewrite its .md; the .md's path."""
    folder.mkdir(parents=True, exist_ok=True)
    result = load(command, folder)
    names = [r["name"] for r in result["runs"]]
    if run["name"] in names:  # a run replaces the one of its name, in its place
        result["runs"][names.index(run["name"])] = run
    else:
        result["runs"].append(run)
    write_json(folder / f"{command}.json", result)
    md = folder / f"{command}.md"
    md.write_text(render(result))
    return md


def table(t: dict[str, Any]) -> list[str]:
    cols = t["columns"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
            *("| " + " | ".join(_cell(v) for v in row) + " |" for row in t["rows"]), ""]


def _cell(v: Any) -> str:
    return "" if v is None else str(v)  # numbers as the command rounded them


def stamp_line(run: dict[str, Any]) -> str:
    s = run["stamp"]
    line = f"`{s['command']}` at commit {s['commit']}, {s['date']}; {s['machine']}."
    if run.get("converted_from"):
        line += (f" Converted from `{run['converted_from']}` (last written at commit {run['converted_at']}), which "
                 "that command produced: not re-run.")
    return line


def render(result: dict[str, Any]) -> str:
    """A command's results file as Markdown: every run, its stamp, notes and tables."""
    lines = [f"# {result['command']}: {result['question']}", "",
             f"Generated from `{result['command']}.json` (`python -m benchmarks.{result['command']}`); one section "
             "a run: its stamp, its notes, its tables.", ""]
    for run in result["runs"]:
        lines += [f"## {run['name']}: {run['title']}", "", stamp_line(run), ""]
        for note in run.get("notes", []):
            lines += [note, ""]
        for t in run.get("tables", []):
            lines += ([t["caption"], ""] if t.get("caption") else []) + table(t)
    return "\n".join(lines).rstrip() + "\n"


class Replay(httpx.BaseTransport):
    """An httpx transport that records each completions prompt's answer while ``recording`` and answers a prompt it
    has a record of from it (same prompt, same top-k), sending only the others on (``missed`` counts them)."""

    def __init__(self) -> None:
        self.inner, self.record, self.recording, self.missed = httpx.HTTPTransport(), {}, True, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        from capcal_integrations.testbed.endpoint import _prompt_list

        if not request.url.path.endswith("/v1/completions"):
            return self.inner.handle_request(request)
        body = json.loads(request.content)
        prompts = _prompt_list(body["prompt"])
        keys = [json.dumps([p, body.get("logprobs")]) for p in prompts]
        todo = list(range(len(keys))) if self.recording else [k for k, key in enumerate(keys) if key not in self.record]
        if todo:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            answer = self.inner.handle_request(httpx.Request("POST", request.url, headers=headers, json={
                **body, "prompt": [prompts[k] for k in todo]}))
            answer.read()
            if answer.status_code != 200:
                return answer
            for k, choice in zip(todo, sorted(answer.json()["choices"], key=lambda c: c["index"])):
                self.record[keys[k]] = choice
            self.missed += 0 if self.recording else len(todo)
        return httpx.Response(200, json={"object": "text_completion", "model": body.get("model"), "choices": [
            {**self.record[key], "index": i} for i, key in enumerate(keys)], "usage": {
                "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})


@contextlib.contextmanager
def server(base_url: str | None, model: str = "0.5b", engine: str = "llamacpp") -> Iterator[Any]:
    """The endpoint to measure: ``base_url`` as given, else the embedded server started for the run."""
    from capcal_integrations.server.launcher import endpoint

    with endpoint(base_url, model, engine=engine, reuse_default=False) as ep:
        yield ep
