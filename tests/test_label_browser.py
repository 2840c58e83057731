"""capcal label in a real browser (issue 50): headless Chromium from the system's packages, driven by Playwright.
Three questions graded with the keyboard, the server killed and started again, the grades still there and
grading going on where it stopped; then ``capcal decide --judged`` reads the file.

Skipped when Playwright or Chromium is missing, unless ``CAPCAL_REQUIRE_BROWSER=1`` (``.ci/run`` sets it, after
installing both). ``CAPCAL_LABEL_SCREENSHOT=PATH`` saves the page as graded (docs/label-page.png was taken the same way)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from capcal_integrations.commands import cli
from capcal_integrations.commands.decide import read_triples, run
from capcal_integrations.content_check.decision import ContentDecision
from capcal_integrations.testbed import simulated_endpoint

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
GRADES = [(3, 0, 1), (0, 2, 0), (1, 1, 3), (2, 0, 0), (0, 0, 2)]  # one row per question, keyed in order
TOPICS = ["fleas", "honey", "venus", "owls", "bamboo", "salt"]


def _need(ok: bool, why: str) -> None:
    if not ok:
        (pytest.fail if os.environ.get("CAPCAL_REQUIRE_BROWSER") == "1" else pytest.skip)(why)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "Playwright is not installed (pip install playwright)")
    _need(os.path.exists(CHROMIUM), f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


class Label:
    """``capcal label`` as a child process, its URL read from what it prints."""

    def __init__(self, questions, out) -> None:
        env = {**os.environ, "CAPCAL_API_KEY": "label-test-key"}
        self.process = subprocess.Popen([sys.executable, "-m", "capcal_integrations.commands.cli", "label",
                                         str(questions), "--out", str(out), "--port", "0"],
                                        stderr=subprocess.PIPE, text=True, env=env)
        lines = []
        for line in self.process.stderr:
            lines.append(line)
            found = re.search(r"open (http://127\.0\.0\.1:\d+/#key=\S+)", line)
            if found:
                self.url = found.group(1)
                return
        raise AssertionError(f"capcal label did not start: {''.join(lines)}")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


def _progress(page, graded: int, total: int) -> None:
    page.wait_for_function("([g, t]) => document.getElementById('progress').textContent.includes("
                           "`${g} of ${t} passages graded`) && document.getElementById('progress').textContent"
                           ".includes('all saved')", arg=[graded, total], timeout=10_000)


def test_grade_with_the_keyboard_kill_restart_and_decide(browser, tmp_path, capsys):
    questions, out = tmp_path / "questions.jsonl", tmp_path / "labels.jsonl"
    passages = {t: [f"A passage about {t}, number {j}: " + " ".join([t] * (j + 2)) for j in range(3)] for t in TOPICS}
    questions.write_text("".join(json.dumps({"query": f"a question about {t}", "passages": passages[t]}) + "\n"
                                 for t in TOPICS))
    label = Label(questions, out)
    try:
        page = browser.new_page(viewport={"width": 1000, "height": 640})
        page.goto(label.url)
        page.wait_for_selector("li.focus")
        assert page.text_content("#query") == "a question about fleas"
        assert "key=" not in page.url  # the key leaves the address bar
        for row in GRADES[:3]:
            for g in row:
                page.keyboard.press(str(g))
        _progress(page, 9, 18)
        assert page.text_content("#query") == "a question about owls"  # moved on after each question's last grade
        shot = os.environ.get("CAPCAL_LABEL_SCREENSHOT")
        page.keyboard.press("ArrowLeft")
        if shot:
            page.screenshot(path=shot)
        page.keyboard.press("ArrowRight")
        # every grade is in the file already: the triples capcal decide --judged reads
        assert read_triples(cli.build_parser().parse_args(["decide", "--judged", str(out)])) == \
            [(f"a question about {t}", passages[t], list(row)) for t, row in zip(TOPICS, GRADES[:3])]
    finally:
        label.kill()  # no chance to save anything more

    label = Label(questions, out)
    try:
        page.goto(label.url)
        page.wait_for_selector("li.focus")
        _progress(page, 9, 18)
        assert page.text_content("#query") == "a question about owls"  # resumed at the first ungraded question
        for row in GRADES[3:]:
            for g in row:
                page.keyboard.press(str(g))
        _progress(page, 15, 18)
    finally:
        label.kill()
    args = cli.build_parser().parse_args(["decide", "--judged", str(out), "--json"])
    triples = read_triples(args)
    assert triples == [(f"a question about {t}", passages[t], list(row)) for t, row in zip(TOPICS, GRADES)]
    assert run(args, simulated_endpoint(triples, s=2.0, seed=1).reranker()) == 0
    assert ContentDecision.from_json(capsys.readouterr().out).judged == 5
