"""How far one warm ``rerank`` walks (issue 37): the generator stack each request climbs, and how often the
running code changes file.

One warm CapCal reranking of 8 passages (``guard=None``: the ranking alone, after a first call that probed the
endpoint) against the test double's llama.cpp dialect (:mod:`capcal_integrations.testing`; no server needed), in
the sync driver, through ``rerank`` (an adapter reaches it by plain calls, adding no generator frame):

* **generator frames per request**: when the driver sends a request, the chain of generators the flow is
  suspended in (the flow ``run_sync`` drives, then each ``yield from`` below it), and the files they are in;
* **file changes**: every Python call and return in the library's core (``capcal_integrations``, the test double
  and the adapters excluded) is an event; an event in a file other than the previous event's is one change.

Prints both and writes ``benchmarks/results/walk.md``.

    python benchmarks/walk.py [--passages 8]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import types
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.testing import clients, make_handler  # noqa: E402

CORE = str(HERE.parent / "capcal_integrations") + "/"
OUTSIDE = (CORE + "testing/", CORE + "integrations/")  # the double answering, and the adapters' shared settings


def _core(filename: str) -> str | None:
    return filename[len(CORE):] if filename.startswith(CORE) and not filename.startswith(OUTSIDE) else None


def _stack(flow: Any) -> list[str]:
    """The files of the generators ``flow`` is suspended in, outermost first."""
    files = []
    while isinstance(flow, types.GeneratorType):
        files.append(_core(flow.gi_frame.f_code.co_filename) or flow.gi_frame.f_code.co_filename)
        flow = flow.gi_yieldfrom
    return files


class Walk:
    """A profile hook: file changes between core events, and the generator stack at each request sent."""

    def __init__(self) -> None:
        self.changes = self.events = 0
        self.last: str | None = None
        self.files: set[str] = set()
        self.stacks: list[list[str]] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        where = frame.f_code.co_filename if event == "call" else (frame.f_back and frame.f_back.f_code.co_filename)
        name = _core(where or "")
        if event == "call" and frame.f_code.co_name == "_send_sync" and name == "transport/drivers.py":
            caller = frame.f_back
            while caller is not None and "run" not in caller.f_locals:
                caller = caller.f_back
            if caller is not None:
                self.stacks.append(_stack(caller.f_locals["run"].flow))
        if name is None:
            return
        self.events += 1
        self.files.add(name)
        if self.last is not None and name != self.last:
            self.changes += 1
        self.last = name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=8)
    ap.add_argument("--out", default=str(HERE / "results" / "walk"))
    args = ap.parse_args()
    sync, async_ = clients(make_handler())
    rr = CapCalReranker(client=sync, async_client=async_, method="capcal", guard=None)
    passages = [f"passage {k} about topic {k % 3}" for k in range(args.passages)]
    def call() -> Any:
        return rr.rerank("a query", passages)

    call()  # the first call probes the endpoint and learns the identifiers' tokens
    walk = Walk()
    sys.setprofile(walk)
    try:
        call()
    finally:
        sys.setprofile(None)
    depth = [len(s) for s in walk.stacks]
    deepest = max(walk.stacks, key=len) if walk.stacks else []
    lines = ["# How far one warm rerank walks (issue 37)", "",
             f"`python benchmarks/walk.py --passages {args.passages}`: one warm CapCal reranking of {args.passages} "
             "passages through `rerank` (sync, `guard=None`) against the test double's llama.cpp dialect. (An "
             "adapter's call reaches `rerank` through plain calls: it adds no generator frame.)", "",
             f"- requests sent: {len(walk.stacks)}",
             f"- generator frames the flow is suspended in when a request is sent: at most {max(depth, default=0)}, "
             f"median {statistics.median(depth) if depth else 0} (deepest, outermost first: "
             f"{' > '.join(f'`{f}`' for f in deepest)})",
             f"- the core's files entered: {len(walk.files)}",
             f"- calls and returns in the core: {walk.events}; file changes between them: {walk.changes}"]
    text = "\n".join(lines) + "\n"
    pathlib.Path(args.out).with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
