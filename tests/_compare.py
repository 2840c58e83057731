"""Comparing two rankings of the same inputs from a real server.

llama.cpp's log-probabilities drift between calls (prompt-cache state, and concurrent requests
batched together change the numerics: async runs drift more than sequential ones), and the
calibration ``p - alpha (q - 1/|C|)`` with ``alpha`` up to 2 amplifies the drift of ``q`` twice over.
So orders must agree except where the model was at a near-tie, and scores within a tolerance, unless one
reading is answered from the other's record (:func:`replaying`, :func:`lazy_from_record`): then exactly.
"""

from __future__ import annotations

import json

import httpx
import openai

from benchmarks._common import Replay
from capcal_integrations import CapCalReranker, Ranking
from capcal_integrations.testing import every_node

#: How far the model's own probabilities (``Step.p`` and ``Step.q``) of two runs may differ: the
#: server's drift, about 0.01 nat, more when concurrent requests are batched together.
DRIFT = 0.03
#: vLLM's CPU build: a request batched with others (the async run sends the real and the empty stream at once)
#: computes other numbers than the same request alone; measured up to .031 on a two-candidate step (CI, 2 cores).
VLLM_DRIFT = 0.04
#: Score tolerance of two runs that chose alike (rank-consistent scores move little).
TIE = 0.05


def near_tie(alpha: float, drift: float = DRIFT) -> float:
    """The largest gap between two candidates' calibrated scores that drift can close: with ``p`` and
    ``q`` each within ``DRIFT``, ``s_i - s_j`` of ``p - alpha (q - 1/|C|)`` moves by at most
    ``2 DRIFT (1 + alpha)``; a pick that flips across a wider gap is a real disagreement."""
    return 2 * drift * (1 + alpha)


def assert_same_ranking(got: Ranking, want: Ranking, tol: float = TIE, drift: float = DRIFT) -> None:
    """``got`` and ``want`` rank alike: identical orders and scores within ``tol``, or the first
    decoding step where they chose differently was a near-tie (both picks within :func:`near_tie`) in both,
    after identical choices before it."""
    assert sorted(got.order) == sorted(want.order) == list(range(len(want.order)))
    assert_same_model_probabilities(got, want, drift)
    if got.order == want.order:
        assert all(abs(a - b) <= tol for a, b in zip(got.scores, want.scores, strict=True)), (got.scores, want.scores)
        return
    for a, b in zip(got.steps, want.steps, strict=True):
        assert a.candidates == b.candidates, (a, b)
        if a.chosen != b.chosen:
            for step in (a, b):
                s = dict(zip(step.candidates, step.scores, strict=True))
                assert abs(s[a.chosen] - s[b.chosen]) <= near_tie(step.alpha, drift), (
                    f"orders differ beyond a near-tie: {got.order} vs {want.order}; {step}")
            return
    if got.decoded is not None and got.decoded == want.decoded and got.order[:got.decoded] == want.order[:got.decoded]:
        _assert_below_depth_alike(got, want)  # every decoded place alike; the places below follow the last step
        return
    raise AssertionError(f"orders differ but every step chose alike: {got.order} vs {want.order}")


def _assert_below_depth_alike(got: Ranking, want: Ranking) -> None:
    """Below the depth, places follow the last decoded step's scores (.depth): two runs may order them
    differently only where those scores were at a near-tie in both runs."""
    below_got, below_want = got.order[got.decoded:], want.order[want.decoded:]
    place = {i: r for r, i in enumerate(below_want)}
    last = [dict(zip(run.steps[-1].candidates, run.steps[-1].scores, strict=True)) for run in (got, want)]
    alpha = max(got.steps[-1].alpha, want.steps[-1].alpha)
    for r, i in enumerate(below_got):
        for j in below_got[r + 1:]:
            if place[j] < place[i]:  # ordered differently
                assert all(abs(s[i] - s[j]) <= near_tie(alpha) for s in last), (
                    f"places below the depth differ beyond a near-tie: {got.order} vs {want.order}")


def assert_same_model_probabilities(got: Ranking, want: Ranking, tol: float = DRIFT) -> None:
    """At every decoding step both runs took over the same candidates, the real and the empty
    stream's distributions agree within ``tol``."""
    for a, b in zip(got.steps, want.steps):
        if a.candidates != b.candidates:
            break
        for x, y in ((a.p, b.p), (a.q, b.q)):
            assert (x is None) == (y is None)
            if x is not None:
                assert max(abs(u - v) for u, v in zip(x, y, strict=True)) <= tol, (a, b)


def assert_same_order_up_to_ties(got: Ranking, want: Ranking, tol: float = TIE) -> None:
    """Scores within ``tol`` of each other, and every pair of items that the two orders place
    differently within ``tol`` in both rankings' scores (for first-token rankings, whose scores are
    the calibrated first-step scores themselves)."""
    assert sorted(got.order) == sorted(want.order) == list(range(len(want.order)))
    assert_same_model_probabilities(got, want)
    assert all(abs(a - b) <= tol for a, b in zip(got.scores, want.scores, strict=True)), (got.scores, want.scores)
    where = {item: r for r, item in enumerate(got.order)}
    for r, i in enumerate(want.order):
        for j in want.order[r + 1:]:
            if where[i] > where[j]:  # want puts i above j, got the other way round
                for ranking in (got, want):
                    gap = near_tie(max((s.alpha for s in ranking.steps), default=0.0))
                    assert abs(ranking.scores[i] - ranking.scores[j]) <= gap, (got.order, want.order, i, j)





def replaying(base_url: str) -> tuple[Replay, list, CapCalReranker]:
    """A reranker on ``base_url`` whose answers are recorded while ``replay.recording`` and answered from the record
    after (``benchmarks.fidelity lazy``'s Replay), and the requests it sends."""
    replay, sent = Replay(), []
    http = httpx.Client(transport=replay, event_hooks={"request": [sent.append]}, timeout=600)
    rr = CapCalReranker(client=openai.OpenAI(base_url=base_url, api_key="x", http_client=http, max_retries=0), guard=None)
    rr.capabilities()
    return replay, sent, rr


def lazy_from_record(replay: Replay, sent: list, whole_rr: CapCalReranker, lazy_rr: CapCalReranker, query: str,
                     passages: list[str]) -> tuple[Ranking, Ranking, int, int]:
    """``whole_rr`` ranking with every node asked, its answers recorded, then ``lazy_rr`` answered from that record,
    so that the server's drift between two batches cannot part them: every step chose alike and every prompt the lazy
    reading asked is in the record (asserted). The two rankings and the prompts each asked."""
    sent.clear()
    replay.recording = True
    with every_node(whole_rr) as every:
        whole = every.rerank(query, passages)
    whole_prompts = prompts_sent(sent)
    sent.clear()
    replay.recording, replay.missed = False, 0
    lazy = lazy_rr.rerank(query, passages)
    assert [s.chosen for s in lazy.steps] == [s.chosen for s in whole.steps] and lazy.order == whole.order
    assert replay.missed == 0
    return lazy, whole, prompts_sent(sent), whole_prompts


def prompts_sent(sent: list) -> int:
    """How many prompts (trie nodes) the recorded completions prompt lists asked."""
    return sum(len(json.loads(r.content)["prompt"]) for r in sent if r.url.path.endswith("/v1/completions"))
