"""``capcal label``: a page on this machine to grade retrieved passages, one question at a time.

    capcal label questions.jsonl --out labels.jsonl        # then open the URL it prints
    capcal decide --judged labels.jsonl                    # decide from the grades

The input is JSONL, one question a line: ``{"query": ..., "passages": [...]}`` (a passage a string or
``{"text", "title"?, "id"?}``), or the shared data layout's ``{"query", "candidates": [{"docid", "text"}]}``
(``--top`` of them). Keys ``0``-``3`` grade the focused passage and move on; every grade is appended at once to
``--out`` (a JSONL of the question's whole state, ``capcal decide --judged`` reads it: the newest line of a
question wins, and a question with passages still ungraded is left out there), flushed and fsynced, so a
closed tab or a killed process loses nothing and a restart resumes from the file.

The server is bound to 127.0.0.1 only and always has a key, as ``capcal serve`` does (``--api-key``,
``$CAPCAL_API_KEY``, else a random one): the page's URL carries it after ``#`` (never sent over the network, nor
logged), and every request for questions or grades must send it; a request naming another host is refused (DNS
rebinding), and no other origin may read an answer (no CORS headers).
"""

from __future__ import annotations

import argparse
import hmac
import http.server
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..errors import CapCalError, InputError
from .judged_files import _json_lines

__all__ = ["Labels", "read_questions", "make_server", "main"]

log = logging.getLogger(__name__)
GRADES = (0, 1, 2, 3)
MAX_BODY = 4096


def _passage(path: str, n: int, p: Any) -> dict[str, str]:
    if isinstance(p, str):
        return {"text": p}
    text = p.get("text") if isinstance(p, dict) else None
    if not isinstance(text, str):
        raise InputError(f"{path}, line {n}: a passage must be a string or an object with \"text\"")
    return {k: str(p[k]) for k in ("text", "title", "id") if p.get(k) not in (None, "")} | (
        {"id": str(p["docid"])} if "docid" in p else {})


def read_questions(path: str, top: int = 20) -> list[dict[str, Any]]:
    """The questions of ``path``: ``{"query", "passages": [{"text", "title"?, "id"?}]}`` each."""
    out = []
    for n, value in _json_lines(path):
        query, passages = value.get("query"), value.get("passages", value.get("candidates"))
        if not isinstance(query, str) or not query.strip():
            raise InputError(f"{path}, line {n}: \"query\" must be a non-empty string")
        if not isinstance(passages, list) or not passages:
            raise InputError(f"{path}, line {n}: \"passages\" (or \"candidates\") must be a non-empty list")
        out.append({"query": query, "passages": [_passage(path, n, p) for p in passages[:top]]})
    if not out:
        raise InputError(f"{path}: no questions")
    return out


class Labels:
    """The questions and their grades (``None``: not yet graded), kept in ``out``: one JSONL line per grade, the
    question's whole state, appended, flushed and fsynced before the grade is acknowledged."""

    def __init__(self, questions: Sequence[dict[str, Any]], out: str) -> None:
        self.questions, self.out, self._lock = list(questions), out, threading.Lock()
        self.grades: list[list[int | None]] = [[None] * len(q["passages"]) for q in self.questions]
        self._resume()

    def _resume(self) -> None:
        """Grades from ``out`` (the newest line of each question wins). Every line written ends with a newline, so
        text after the last one is a line cut short by a kill mid-write: it is dropped."""
        if not os.path.exists(self.out):
            return
        with open(self.out, "rb") as f:
            raw = f.read()
        *lines, tail = raw.split(b"\n")
        if tail:
            log.warning("%s: the last line was cut short (a kill mid-write?); dropped", self.out)
            self._rewrite(raw[:len(raw) - len(tail)])
        by_query = {q["query"]: i for i, q in enumerate(self.questions)}
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
                i, grades = by_query.get(value["query"]), list(value["grades"])
                texts = [p["text"] if isinstance(p, dict) else p for p in value["passages"]]
                pending = set(value.get("ungraded", ()))
            except (ValueError, KeyError, TypeError):
                raise InputError(f"{self.out}, line {n}: not a line capcal label wrote; grade into another --out") \
                    from None
            if i is not None and texts == [p["text"] for p in self.questions[i]["passages"]]:
                self.grades[i] = [None if j in pending else g for j, g in enumerate(grades)]

    def _rewrite(self, data: bytes) -> None:
        tmp = f"{self.out}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.out)

    def grade(self, question: int, passage: int, grade: int) -> dict[str, Any]:
        if not (0 <= question < len(self.questions) and 0 <= passage < len(self.grades[question])):
            raise InputError(f"no passage {passage} of question {question}")
        if grade not in GRADES:
            raise InputError(f"a grade is 0, 1, 2 or 3, got {grade!r}")
        with self._lock:
            grades = self.grades[question]
            grades[passage] = grade
            q = self.questions[question]
            line = json.dumps({"query": q["query"], "passages": [p if set(p) != {"text"} else p["text"]
                                                                 for p in q["passages"]],
                               "grades": [g or 0 for g in grades],
                               "ungraded": [j for j, g in enumerate(grades) if g is None]}) + "\n"
            with open(self.out, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        return self.progress()

    def progress(self) -> dict[str, int]:
        done = [all(g is not None for g in gs) for gs in self.grades]
        return {"questions": len(self.questions), "questions_done": sum(done),
                "passages": sum(map(len, self.grades)), "graded": sum(g is not None for gs in self.grades for g in gs)}

    def state(self) -> dict[str, Any]:
        return {"questions": [{**q, "grades": g} for q, g in zip(self.questions, self.grades)],
                "progress": self.progress(), "out": os.path.abspath(self.out)}


def make_server(labels: Labels, key: str, port: int = 0) -> http.server.ThreadingHTTPServer:
    """The page's server on 127.0.0.1:``port`` (0: a free one)."""
    from .label_page import PAGE

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "capcal-label"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("%s", format % args)

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
                                                        "style-src 'unsafe-inline'; connect-src 'self'")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            self._send(status, json.dumps(value).encode())

        def _allowed(self, with_key: bool) -> bool:
            port = self.server.server_address[1]
            if self.headers.get("Host") not in (f"127.0.0.1:{port}", f"localhost:{port}"):
                self._json(403, {"error": "wrong host"})
                return False
            origin = self.headers.get("Origin")
            if origin is not None and origin not in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                self._json(403, {"error": "wrong origin"})
                return False
            sent = self.headers.get("Authorization", "")
            if with_key and not hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
                self._json(401, {"error": "the key is missing or wrong: open the URL capcal label printed"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/":
                if self._allowed(with_key=False):
                    self._send(200, PAGE.encode(), "text/html; charset=utf-8")
            elif self.path == "/api/state":
                if self._allowed(with_key=True):
                    self._json(200, labels.state())
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/grade":
                return self._json(404, {"error": "not found"})
            if not self._allowed(with_key=True):
                return None
            size = int(self.headers.get("Content-Length") or 0)
            if not 0 < size <= MAX_BODY:
                return self._json(413, {"error": "a grade is a small JSON object"})
            try:
                body = json.loads(self.rfile.read(size))
                self._json(200, labels.grade(int(body["question"]), int(body["passage"]), body["grade"]))
            except (ValueError, KeyError, TypeError, InputError) as err:
                self._json(400, {"error": str(err)})
            except OSError as err:  # the grade is not kept: say so, the page shows it
                self._json(500, {"error": f"could not save the grade: {err}"})
            return None

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> int:
    from ..server.ownership import new_key

    p = argparse.ArgumentParser(prog="capcal label", description=__doc__.split("\n\n")[0])
    p.add_argument("questions", help="JSONL: {query, passages} (or {query, candidates}) per line")
    p.add_argument("--out", default="labels.jsonl", help="the grades, appended (default labels.jsonl); resumed")
    p.add_argument("--port", type=int, default=8095, help="the port on 127.0.0.1 (default 8095; 0: a free one)")
    p.add_argument("--top", type=int, default=20, help="passages per question shown (default 20)")
    p.add_argument("--api-key", default=None, help="the page's key (default: $CAPCAL_API_KEY, else a random one)")
    args = p.parse_args(argv)
    try:
        labels = Labels(read_questions(args.questions, args.top), args.out)
        key = args.api_key or os.environ.get("CAPCAL_API_KEY") or new_key()
        server = make_server(labels, key, args.port)
    except (CapCalError, OSError) as err:
        sys.stderr.write(f"capcal label: error: {err}\n")
        return 1
    done = labels.progress()
    sys.stderr.write(f"capcal label: {done['graded']} of {done['passages']} passages graded, saved in {args.out}\n"
                     f"open http://127.0.0.1:{server.server_address[1]}/#key={key}\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
