"""``capcal rerank``: passages from a file or JSONL requests in, JSONL rankings out (one record per query: the order,
each passage with the model's score or, where no model placed the list, its own; the notes); with ``--workers`` or
several ``--base-url``, a batch run on Ray (:mod:`.batch`). ``--output`` is replaced only when the whole run
succeeded."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import InputError

if TYPE_CHECKING:
    from ..reranker import CapCalReranker
    from ..types import Ranking

__all__ = ["run", "read_requests"]


def read_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--query`` + ``--passages FILE`` (one passage per line, or JSONL with ``text``), or ``--input``
    JSONL with ``{"query": ..., "passages": [...]}`` (``candidates`` also accepted) per line."""
    if args.input:
        with open(args.input, encoding="utf-8") if args.input != "-" else contextlib.nullcontext(sys.stdin) as f:
            rows = [_json(line, args.input) for line in f if line.strip()]
        for row in rows:
            row.setdefault("passages", row.get("candidates"))
            if not isinstance(row.get("query"), str) or not isinstance(row.get("passages"), list):
                raise InputError(f"every --input line needs 'query' and 'passages': {str(row)[:120]}")
        return rows
    if not (args.query and args.passages):
        raise InputError("give --query and --passages FILE, or --input JSONL")
    with open(args.passages, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    passages = [_json(line, args.passages) if line.lstrip().startswith("{") else line for line in lines]
    return [{"query": args.query, "passages": passages}]


def _json(line: str, source: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as err:
        raise InputError(f"{source}: not a JSON line ({err}): {line[:80]!r}") from None


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[TextIO]:
    """A new file beside ``path`` that replaces it only when the block succeeds. On any failure
    ``path`` is left as it was and the new file removed (``open(path, "w")`` emptied it before the
    first request)."""
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    f = open(tmp, "x", encoding="utf-8")  # closed below, before the rename
    try:
        with f:
            yield f
        with contextlib.suppress(FileNotFoundError):  # an existing file keeps its permissions
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def run(args: argparse.Namespace, connect: Callable[[], contextlib.AbstractContextManager[CapCalReranker]],
        options: dict[str, Any]) -> int:
    """``capcal rerank``: ``connect()`` gives the reranker for the endpoint (``capcal``'s own lookup),
    ``options`` the ranking options given on the command line."""
    from tqdm import tqdm

    if args.workers is not None or (args.base_url and "," in args.base_url):
        return _rerank_batch(args, options)
    requests = read_requests(args)
    sink = _replacing(args.output) if args.output else contextlib.nullcontext(sys.stdout)
    with sink as out, connect() as rr:
        if args.top_n and "depth" not in options:  # decode only the places written
            rr = rr.with_options(depth=args.top_n)
        for row in tqdm(requests, desc=f"rerank ({rr.method})", unit="query", disable=len(requests) < 2 and None):
            ranking = rr.rerank(row["query"], row["passages"])
            ranked = [{"index": i, "score": _score(ranking, i, row["passages"][i]), "passage": row["passages"][i]}
                      for i in ranking.order]
            if args.top_n:
                ranked = ranked[: args.top_n]
            record = {"query": row["query"], "method": ranking.method, "order": list(ranking.order), "ranked": ranked,
                      "requests": ranking.usage.requests, "upper_bounds": ranking.upper_bounds,
                      "kept_given_order": ranking.kept_given_order, "notes": list(ranking.notes)}
            if "qid" in row:
                record["qid"] = row["qid"]
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
    return 0


def _score(ranking: Ranking, i: int, passage: Any) -> float | None:
    """The model's score of passage ``i``; where no model placed the list (kept in its given order), the passage's
    own ``"score"`` if it has one, else ``None``: never a score made from places."""
    if ranking.placed_by_model:
        return ranking.scores[i]
    own = passage.get("score") if isinstance(passage, dict) else None
    return own if isinstance(own, (int, float)) and not isinstance(own, bool) else None


def _rerank_batch(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``--workers`` or several ``--base-url``: Ray workers, one endpoint each, appending to ``--output``
    and skipping the lists it already holds (capcal_integrations/commands/batch.py)."""
    from .batch import rerank_batch

    if not (args.input and args.input != "-" and args.output and args.base_url):
        raise InputError("a batch run (--workers, or several --base-url) needs --input FILE, --output FILE "
                         "(appended to; a stopped run resumes) and --base-url URL[,URL...]")
    urls = [u.strip() for u in args.base_url.split(",") if u.strip()]
    result = rerank_batch(args.input, args.output, endpoints=urls, workers=args.workers, api_key=args.api_key,
                          model=args.model_name, top_n=args.top_n, **options)
    sys.stderr.write(f"capcal: {result.ranked} lists ranked, {result.skipped} already in {result.output}\n")
    return 0
