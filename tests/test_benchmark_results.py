"""The benchmarks' results page and the README's quoted numbers agree with the results' JSON (no data, no server).

``benchmarks/README.md`` and every ``benchmarks/results/<command>/<command>.md`` are generated from the JSON by
``python -m benchmarks.page``; the numbers the README quotes from a benchmark are listed in
``benchmarks.page.QUOTES``, each formatted from its JSON cell. After a new run, ``python -m benchmarks.page`` and the
README's sentence must follow, or these fail.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _common as C  # noqa: E402
from benchmarks import page  # noqa: E402


def test_the_results_page_and_each_results_md_are_what_the_json_gives():
    assert page.stale() == [], "run `python -m benchmarks.page`"


def test_every_number_the_readme_quotes_from_a_benchmark_is_its_json_s():
    assert page.quotes_disagreeing() == []


def test_a_readme_number_that_disagrees_with_its_json_fails():
    readme = page.README.read_text()
    quoted = page.QUOTES[0][1]()
    changed = readme.replace(quoted.split()[-1], "0.9999", 1)
    assert changed != readme
    assert page.quotes_disagreeing(changed) != []


def test_results_hold_one_folder_per_command_and_every_run_is_stamped():
    assert {p.name for p in C.RESULTS.iterdir()} == set(C.QUESTIONS)
    for command in C.QUESTIONS:  # its .md, its .json, and the raw records its runs read or wrote
        assert {p.name for p in (C.RESULTS / command).iterdir()} <= {f"{command}.md", f"{command}.json", "records"}
    for command in C.QUESTIONS:
        path = C.RESULTS / command / f"{command}.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        assert result["command"] == command
        for run in result["runs"]:
            assert all(run["stamp"].get(k) for k in ("commit", "date", "machine", "command")), run["name"]
            assert bool(run.get("converted_from")) == bool(run.get("converted_at")), run["name"]
            for t in run.get("tables", []):
                assert all(len(row) == len(t["columns"]) for row in t["rows"]), run["name"]


@pytest.mark.parametrize("command", list(C.QUESTIONS))
def test_each_command_documents_a_smoke_and_a_full_run(command):
    lines = page.commands(command)
    assert any("--smoke" in line for line in lines) and any("--smoke" not in line for line in lines)
