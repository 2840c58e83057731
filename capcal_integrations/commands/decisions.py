"""``capcal status`` (or ``capcal decisions``): the content decisions kept across processes and the checks still
deciding (:mod:`.saved_decisions`, :mod:`.saved_readings`).

    capcal status                      # one line each: id, model, weights, key, verdict (or "deciding: ..."), when
    capcal status --json               # the same as JSON rows
    capcal decisions forget 3fa9c2d1   # the decision (and readings) of a whole id, of a unique prefix of 8 or
                                       # more characters, or every one of a model (a shorter or shared prefix:
                                       # refused, the matches listed)
    capcal decisions forget --all

A file that cannot be used (not JSON, not UTF-8, a named pipe, another user's, ...) is listed as "unusable" with
why; forget deletes it like any other. A folder that another user owns or can write is named on stderr: the
library does not use it.

A forgotten decision is taken again by the next ranking that needs it (the content check decides afresh, from
no readings when those are forgotten too). A check in progress is shown as of its last query read, by any process.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ..content_check.saved_decisions import STORE, Saved
from ..content_check.saved_readings import Progress
from ..errors import InputError

__all__ = ["main", "parser"]


def _out(text: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def describe(saved: Saved) -> dict[str, Any]:
    """One saved decision as a listing shows it: id, model, weights, what else its key holds, verdict, source, when."""
    d = saved.decision
    key = dict(d.key) if d is not None else {}
    rest = {k: v for k, v in key.items() if k not in ("model", "weights")}
    summary = ", ".join(f"{k}={v}" for k, v in rest.items() if k in ("template", "prompt", "rule", "window"))
    return {"id": saved.id, "model": key.get("model", "?"), "weights": key.get("weights", ""), "key": summary,
            "verdict": d.verdict if d is not None else f"unusable: {saved.problem}", "source": saved.source,
            "saved_at": saved.saved_at, "lists": d.lists if d is not None else None, "path": str(saved.path)}


def describe_progress(progress: Progress) -> dict[str, Any]:
    """A check in progress as a listing shows it, in :func:`describe`'s columns."""
    key = dict(progress.key)
    summary = ", ".join(f"{k}={v}" for k, v in key.items() if k in ("template", "prompt", "rule", "window"))
    verdict = (f"deciding: {len(progress.readings)} queries read, e = {progress.e_value:.3g}" if not progress.problem
               else f"unusable: {progress.problem}")
    return {"id": progress.id, "model": key.get("model", "?"), "weights": key.get("weights", ""), "key": summary,
            "verdict": verdict, "source": "check in progress", "saved_at": progress.saved_at,
            "lists": len(progress.readings), "path": str(progress.path)}


def parser(prog: str = "capcal decisions") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for symmetry; nothing more is logged)")
    sub = p.add_subparsers(dest="action")
    forget = sub.add_parser("forget", help="delete saved decisions: one by id (a prefix), a model's, or --all")
    forget.add_argument("which", nargs="?", help="an id (whole, or 8 or more of its first digits that no other id "
                        "shares) or a model name")
    forget.add_argument("--all", action="store_true", help="every saved decision")
    forget.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON rows of those deleted")
    return p


def main(argv: Sequence[str], prog: str = "capcal decisions") -> int:
    args = parser(prog).parse_args(list(argv))
    where = STORE.folder
    problem = STORE.problem()
    if problem:
        _out(f"capcal decisions: the folder {where} is not used by rankings: it is {problem} (chown it and chmod 700 "
             "it, or set CAPCAL_DECISIONS_DIR to a folder of yours)", sys.stderr)
    if args.action == "forget":
        if bool(args.all) == bool(args.which):
            raise InputError("capcal decisions forget needs an id (or a model) or --all, not both")
        which = None if args.all else args.which
        progress = [describe_progress(p) for p in STORE.forget_readings(which)]
        try:
            rows = [describe(s) for s in STORE.forget(which)] + progress
        except InputError:
            if not progress:
                raise
            rows = progress
        verb = "forgot"
    else:
        rows = [describe(s) for s in STORE.entries()] + [describe_progress(p) for p in STORE.progress()]
        verb = ""
    if args.json:
        _out(json.dumps(rows, indent=1))
        return 0
    if where is None:
        _out("capcal decisions: none are kept (CAPCAL_DECISIONS_DIR=off)")
        return 0
    if not rows:
        _out(f"capcal decisions: none {'matched' if verb else 'saved'} in {where}")
        return 0
    for r in rows:
        lists = f" after {r['lists']} queries" if r["lists"] is not None and r["source"] != "check in progress" else ""
        _out(f"{verb + ' ' if verb else ''}{r['id']}  {r['model']}  ({r['weights'] or 'no weights'})  [{r['key']}]  "
             f"{r['verdict']}{lists}  ({r['source'] or 'unknown source'}, {r['saved_at'] or 'unknown time'})")
    if not verb:
        _out(f"({len(rows)} in {where}; capcal decisions forget ID|--all deletes; a check in progress is as of its "
             "last query read)", sys.stderr)
    return 0
