"""``capcal status`` (or ``capcal decisions``): the content decisions kept across processes and the checks still
deciding (:mod:`.saved_decisions`, :mod:`.saved_readings`).

    capcal status                      # one line each: id, model, key, verdict (or "deciding: k queries read"), when
    capcal status --json               # the same as JSON rows
    capcal decisions forget 3fa9c2     # the decision (and readings) whose id starts so, or every one of a model
    capcal decisions forget --all

A forgotten decision is taken again by the next ranking that needs it (the content check decides afresh, from
no readings when those are forgotten too). A check in progress is shown as of its last query read, by any process.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from ..content_check.saved_decisions import STORE, describe, describe_progress
from ..errors import InputError

__all__ = ["main", "parser"]


def _out(text: str, stream: TextIO | None = None) -> None:
    (stream or sys.stdout).write(text + "\n")


def parser(prog: str = "capcal decisions") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    p.add_argument("-v", "--verbose", action="store_true", help="(accepted for symmetry; nothing more is logged)")
    sub = p.add_subparsers(dest="action")
    forget = sub.add_parser("forget", help="delete saved decisions: one by id (a prefix), a model's, or --all")
    forget.add_argument("which", nargs="?", help="an id (or its first digits, as listed) or a model name")
    forget.add_argument("--all", action="store_true", help="every saved decision")
    forget.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON rows of those deleted")
    return p


def main(argv: Sequence[str], prog: str = "capcal decisions") -> int:
    args = parser(prog).parse_args(list(argv))
    where = STORE.folder
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
        _out(f"{verb + ' ' if verb else ''}{r['id']}  {r['model']}  [{r['key']}]  {r['verdict']}{lists}  "
              f"({r['source'] or 'unknown source'}, {r['saved_at'] or 'unknown time'})")
    if not verb:
        _out(f"({len(rows)} in {where}; capcal decisions forget ID|--all deletes; a check in progress is as of its "
             "last query read)", sys.stderr)
    return 0
