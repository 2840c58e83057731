"""How much library code one ``rerank`` call runs through: the lines of every function and method of
``capcal_integrations`` that executes during one CapCal reranking of 5 passages (against the
fake llama.cpp-style endpoint of the tests, so it needs no server), and the files they are in.

    python benchmarks/reading_path.py            # run from a checkout; prints two lines
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import sys
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.testing import clients, make_handler  # noqa: E402

PACKAGE = str(pathlib.Path(__file__).resolve().parent.parent / "capcal_integrations")
DOUBLE = PACKAGE + "/testing/"  # the test double answering the requests: not the library's reading path


def main() -> None:
    sync, async_ = clients(make_handler())
    rr = CapCalReranker(client=sync, async_client=async_)
    for when in ("first call (probes the endpoint)", "a later call"):
        print(f"{when}: {_path(rr)}")


def _path(rr: CapCalReranker) -> str:
    seen = set()

    def profile(frame, event, arg):
        code = frame.f_code  # comprehensions and lambdas are counted with the function around them
        if event == "call" and code.co_filename.startswith(PACKAGE) and not code.co_filename.startswith(DOUBLE) \
                and not code.co_name.startswith("<"):
            seen.add(code)

    sys.setprofile(profile)
    rr.rerank("how long is the life cycle of a flea", [f"passage {i}" for i in range(5)])
    sys.setprofile(None)
    lines = code = 0
    for function in seen:
        source = inspect.getsource(function)
        lines += len(source.splitlines())
        code += _code_lines(source)
    files = sorted({pathlib.Path(c.co_filename).name for c in seen})
    return (f"{len(seen)} functions, {lines} lines ({code} without docstrings, comments and blank lines), "
            f"{len(files)} files: {', '.join(files)}")


def _code_lines(source: str) -> int:
    """Lines of a function's source that are code: not blank, not a comment, not its docstring."""
    tree = ast.parse(textwrap.dedent(source))
    body = tree.body[0].body
    doc = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for n, line in enumerate(textwrap.dedent(source).splitlines(), 1)
               if n not in doc and line.strip() and not line.strip().startswith("#"))


if __name__ == "__main__":
    main()
