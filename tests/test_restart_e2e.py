"""Issue 33's "Restart" (end to end): against the real server, a second process on the same model ranks its first
list with the first process's decision and sends no deciding prompt.

The first process (this test) probes the server and takes a decision about its real key (the served model, the
weights fingerprint the server reports, the default reading options): the decision is given to it (the
``decision`` option) rather than read from the model, because reading a deciding query on the 0.5B takes minutes
on this machine; what is tested is what happens to a decision, not how it is taken (tests/test_decisions.py tests
the store with decisions the check takes itself). The second process is a new Python process with the same
decision folder: every HTTP request it sends is counted, and none is a reading for the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.content_check.check import ContentDecision, decision_key
from capcal_integrations.content_check.saved_decisions import Store

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parent.parent

SECOND = r"""
import json, sys, time
import httpx2
from capcal_integrations import CapCalReranker
from tests._samples import PASSAGES, QUERY

sent = []
http = httpx2.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]}, timeout=600)
rr = CapCalReranker(base_url=sys.argv[1], api_key="none", http_client=http)
rr.capabilities()
probe = len(sent)
ranking = rr.rerank(QUERY, PASSAGES[:4])
time.sleep(2.0)  # a background reading, had one started, would have sent its first requests by now
[check] = rr._state.content.values()
print(json.dumps({"method": ranking.method, "notes": list(ranking.notes), "ranking_requests": ranking.usage.requests,
                  "after_probe": len(sent) - probe, "queries_read": check.evidence.queries, "checked": list(ranking.checked),
                  "decision": rr.content_decision().to_json()}))
"""


def test_a_second_process_ranks_with_the_first_ones_decision_and_sends_no_deciding_prompt(server_url, tmp_path,
                                                                                             monkeypatch):
    folder = tmp_path / "decisions"
    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(folder))
    first = CapCalReranker(base_url=server_url, api_key="none")
    caps = first.capabilities()
    assert caps.weights, "llama.cpp reports its model path: decisions about its weights are kept"
    taken = ContentDecision(True, "reads", 0.004, 250.0, 0.8, 9, 1.0, 1.0, ((1.0, 0.4),),
                            decision_key(caps.model, caps.weights, first.options))
    assert first.with_options(decision=taken.to_json()).content_decision() == taken  # set once: announced, kept
    assert Store(folder).load(taken.key) == taken

    env = {**os.environ, "CAPCAL_DECISIONS_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SECOND, server_url], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert ContentDecision.from_json(second["decision"]) == taken
    assert second["method"] == "capcal" and "saved" in second["notes"][0]  # ranked by it, calibrated
    assert second["queries_read"] == 0 and second["checked"] == []  # nothing read for the check ...
    assert second["after_probe"] == second["ranking_requests"]  # ... and no request beyond the ranking's own
