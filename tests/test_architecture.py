"""ARCHITECTURE.md, checked against the code (issue 25): the package's import graph, read with ``ast``.

ARCHITECTURE.md holds a fenced ``layers`` block: the layers top to bottom, each with its modules (paths
inside ``capcal_integrations/`` without ``.py``; ``__init__`` is the package itself). The tests:

* every module of the package, subpackages included, is in exactly one layer, and every name there is a
  module; every top-level module is also named (``name.py``) in the text around the block, the drawing;
* no import points up: a module imports from its own layer or the ones below it;
* no import circle anywhere in the package (``server/`` and the other subpackages included).

What counts as an import, decided here: every ``import``/``from ... import`` statement in a module that
names a module of the package, relative or absolute, *wherever it stands*: at module level, inside a
function, under ``if TYPE_CHECKING:``. A function-level import that exists to dodge a circle still is
the dependency it dodges (the code cannot run without the other module), and a type-only import still
says what the module is written against; neither gets a pass. ``from .x import name`` is an edge to
``x`` (or to ``x.name`` where that is a module). Not counted: the parent packages Python imports on the
way to a submodule (``from .models import x`` in ``server/launcher.py`` runs ``server/__init__.py``
first; counting that would make every package a circle with its own modules), and modules named by a
string (``importlib.import_module``: the package uses it only for the openai HTTP library).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "capcal_integrations"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
_BLOCK = re.compile(r"^```layers\n(.*?)^```", re.S | re.M)


def modules() -> dict[str, pathlib.Path]:
    """Every module of the package by its path inside it without ``.py`` (``server/launcher``, ``__init__``)."""
    return {p.relative_to(PACKAGE).with_suffix("").as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}


def _dotted(name: str) -> str:
    """``server/launcher`` -> ``capcal_integrations.server.launcher``; ``server/__init__`` -> ``...server``."""
    parts = [p for p in name.split("/") if p != "__init__"]
    return ".".join(["capcal_integrations", *parts])


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for what counts)."""
    mods = modules()
    by_dotted = {_dotted(m): m for m in mods}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        here = _dotted(name).split(".")
        package = here if path.name == "__init__.py" else here[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                found = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in by_dotted else base for alias in node.names]
            else:
                continue
            for dotted in found:
                while dotted and dotted not in by_dotted and "." in dotted:  # an attribute of a module: the module
                    dotted = dotted.rsplit(".", 1)[0]
                if dotted in by_dotted and by_dotted[dotted] != name:
                    targets.add(by_dotted[dotted])
        graph[name] = targets
    return graph


def layers() -> list[tuple[str, list[str]]]:
    """ARCHITECTURE.md's layers, top to bottom: (name, its modules)."""
    found = _BLOCK.findall(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(found) == 1, "ARCHITECTURE.md needs one ```layers block"
    out: list[tuple[str, list[str]]] = []
    for line in found[0].splitlines():
        line = line.split("#", 1)[0]
        if not line.strip():
            continue
        if line[0].isspace():  # a continuation of the layer above
            out[-1][1].extend(line.split())
        else:
            layer, _, names = line.partition(":")
            out.append((layer.strip(), names.split()))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reads_imports_of_every_kind():
    graph = imports()
    assert "endpoints/__init__" in graph["reading/labels"]  # module level, relative
    assert "endpoints/calls" in graph["endpoints/vllm"]
    assert "endpoints/llamacpp" in graph["endpoints/__init__"]  # from . import llamacpp
    assert "server/vllm" in graph["server/launcher"]  # inside a function
    assert "endpoints/calls" in graph["endpoints/routing"]  # under TYPE_CHECKING
    assert "__init__" in graph["evaluation/command"]  # the package itself, from a function
    assert {"server/__init__", "server/vllm"} <= graph["server/command"]  # from . import serve / vllm
    assert "server/__init__" in graph["testing/router"]


def test_every_module_is_in_exactly_one_layer():
    listed = [m for _, names in layers() for m in names]
    assert sorted(set(listed)) == sorted(listed), f"listed twice: {sorted({m for m in listed if listed.count(m) > 1})}"
    missing, unknown = set(modules()) - set(listed), set(listed) - set(modules())
    assert not missing, f"modules ARCHITECTURE.md's layers do not name: {sorted(missing)}"
    assert not unknown, f"ARCHITECTURE.md's layers name what is no module: {sorted(unknown)}"


def test_the_drawing_names_every_core_module():
    prose = _BLOCK.sub("", ARCHITECTURE.read_text(encoding="utf-8"))
    core = [m for m in modules() if "/" not in m and m != "__init__"]
    subpackages = sorted({m.split("/")[0] for m in modules() if "/" in m})
    missing = [f"{m}.py" for m in core if not re.search(rf"(?<!\w){re.escape(m)}\.py\b", prose)]
    missing += [f"{p}/" for p in subpackages if f"{p}/" not in prose]
    assert not missing, f"ARCHITECTURE.md's drawing does not name {missing}"


def drawn_folders() -> list[str]:
    """The package's folders in the order the drawing (ARCHITECTURE.md's first fenced block) lists them, top first."""
    drawing = re.search(r"^```\n(.*?)^```", ARCHITECTURE.read_text(encoding="utf-8"), re.S | re.M)
    assert drawing, "ARCHITECTURE.md needs its drawing, a fenced block before the layers"
    return re.findall(r"^ ([a-z_]+)/ ", drawing.group(1), re.M)


def test_the_folders_are_layers_in_the_drawings_order():
    """Folders are drawn top to bottom and a folder's modules import only from folders drawn below it (and from
    root modules, whose layers the ``layers`` block gives): the listing is the map, and no two folders need each
    other."""
    order = drawn_folders()
    folders = sorted({m.split("/")[0] for m in modules() if "/" in m})
    assert sorted(order) == folders, f"the drawing lists {order}; the package has {folders}"
    up = [f"{a} -> {b}" for a, targets in imports().items() for b in sorted(targets)
          if "/" in a and "/" in b and order.index(b.split("/")[0]) < order.index(a.split("/")[0])]
    assert not up, "imports from a folder drawn above:\n" + "\n".join(up)


def test_the_root_holds_at_most_ten_modules_and_no_module_is_over_300_lines():
    root = [m for m in modules() if "/" not in m]
    assert len(root) <= 10, root
    long = {m: n for m, path in modules().items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > 300}
    assert not long, long


def test_no_import_points_up():
    rank = {m: k for k, (_, names) in enumerate(layers()) for m in names}
    name = {k: layer for k, (layer, _) in enumerate(layers())}
    up = [f"{a} ({name[rank[a]]}) -> {b} ({name[rank[b]]})" for a, targets in imports().items() for b in sorted(targets)
          if a in rank and b in rank and rank[b] < rank[a]]
    assert not up, "imports that point up a layer:\n" + "\n".join(up)


def test_no_import_circles():
    assert not cycles(imports())


@pytest.mark.parametrize("graph,expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycles_finds_circles(graph, expected):
    assert cycles(graph) == expected


@pytest.mark.parametrize("method", ["capcal", "vanilla", "first-token-capcal"])
def test_a_request_is_sent_from_at_most_six_generators(method):
    """How far a warm ranking walks: when a warm ranking hands a batch of requests to the driver, the flow is suspended in at
    most six generators (``rerank_flow`` > ``_sliding`` > ``rank_window`` > ``label_logprobs`` >
    ``next_token_logprobs`` > the kind's ``send``); the ``walk`` run of benchmarks/results/cost/cost.md also counts
    the file changes."""
    import types

    from capcal_integrations import CapCalReranker
    from capcal_integrations.ranking.strategies import rerank_flow
    from capcal_integrations.testing import clients, make_handler
    from capcal_integrations.transport.drivers import run_sync

    def depth(flow):
        n = 0
        while isinstance(flow, types.GeneratorType):
            n, flow = n + 1, flow.gi_yieldfrom
        return n

    def watched(flow, depths):
        answers = None
        while True:
            try:
                calls = flow.send(answers)
            except StopIteration as stop:
                return stop.value
            depths.append(depth(flow))
            answers = yield calls

    sync, async_ = clients(make_handler(slots=2))
    rr = CapCalReranker(client=sync, async_client=async_, method=method, guard=None)
    passages = [f"passage {k} about topic {k % 3}" for k in range(8)]
    rr.rerank("a query", passages)  # probes the endpoint, learns the identifiers' tokens
    depths: list[int] = []
    ranking, _ = run_sync(watched(rerank_flow(rr._state.for_ranking(), rr.options, "a query", passages), depths), sync)
    assert sorted(ranking.order) == list(range(8)) and depths
    assert max(depths) <= 6, depths
