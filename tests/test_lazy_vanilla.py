"""Vanilla's middle steps ask only the identifier-trie nodes its choice needs (``label_logprobs(best_only=True)``)
where each prompt of a step costs compute of its own (``Kind.costly_prompts``: llama.cpp, vLLM, chat prefill; not
SGLang's prompt lists), against the fake endpoint (random distributions, where every node matters); the real model's
check is in
test_e2e.py. The full reading to compare with is ``capcal`` at ``alpha=0`` asking every node (its own middle steps
are lazy too: test_lazy_capcal.py): the same real stream read whole at every step, whose calibrated scores are ``p``
itself."""

import json
import math

import pytest

from capcal_integrations import CapCalReranker
from tests._compare import every_node
from tests.fake_endpoint import clients, make_handler, no_completions

DIALECTS = {"llama.cpp": {}, "vLLM": {"vllm": True}, "SGLang": {"sglang": True},
            "chat prefill": {"vllm": True, "fault": no_completions}}


def reranker(dialect="llama.cpp", calls=None, **options):
    sync, async_ = clients(make_handler(calls=calls, **DIALECTS[dialect]))
    rr = CapCalReranker(client=sync, async_client=async_, guard=None, **options)
    rr.capabilities()  # the probe's requests are not the ranking's
    if calls is not None:
        calls.clear()
    return rr


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("n, query", [(20, "q one"), (12, "what is x"), (20, "another query"), (9, "z"), (3, "three")])
def test_vanilla_chooses_what_the_full_joint_reading_chooses(n, query, dialect):
    texts = [f"passage {i} about {query} {i * i}" for i in range(n)]
    lazy = reranker(dialect, method="vanilla").rerank(query, texts)
    with every_node(reranker(dialect, method="capcal", alpha=0.0)) as rr:  # capcal's own middle steps: lazy too
        full = rr.rerank(query, texts)
    assert lazy.order == full.order
    for k, (a, b) in enumerate(zip(lazy.steps, full.steps, strict=True)):
        assert a.candidates == b.candidates and a.chosen == b.chosen
        j = a.candidates.index(a.chosen)
        if a.pruned:  # the chosen label exact, the others' bounds at least their values: its share can only fall
            assert 0 < k < len(lazy.steps) - 1 and a.p[j] <= b.p[j] + 1e-12
            assert max(range(len(a.p)), key=lambda i: (a.p[i], -i)) == j
        else:
            assert a.p == pytest.approx(b.p, abs=1e-12)
    assert lazy.steps[0].pruned == 0 and lazy.steps[-1].pruned == 0  # read whole: the records, every passage's p
    if dialect == "SGLang":  # a prefix cache by token: a step's prompts cost little more than one, every node asked
        assert all(s.pruned == 0 for s in lazy.steps)
    elif n >= 12:  # each prompt costs a forward pass (llama.cpp) or a cache block (vLLM): labels that could not win
        assert sum(s.pruned for s in lazy.steps) >= n  # were left unasked


@pytest.mark.parametrize("dialect", ["llama.cpp", "vLLM"])
def test_unasked_labels_hold_upper_bounds_and_fewer_nodes_are_asked(dialect):
    query, texts = "what is x", [f"passage {i} about x {i * 7 % 5}" for i in range(20)]
    lazy_calls, full_calls = [], []
    lazy = reranker(dialect, calls=lazy_calls, method="vanilla").rerank(query, texts)
    with every_node(reranker(dialect, calls=full_calls, method="capcal", alpha=0.0)) as rr:
        rr.rerank(query, texts)
    assert sum(s.pruned for s in lazy.steps) > 0
    prompts = [_prompts(c) for c in (lazy_calls, full_calls)]
    assert prompts[0] < prompts[1] / 2  # the full reading's real stream alone is half its prompts
    requests = sum(c.url.path == "/v1/completions" for c in lazy_calls)
    # at most three rounds a step, each asked again at the endpoint's largest top-k where a wanted token was missing
    assert len(lazy.steps) < requests <= 2 * 3 * len(lazy.steps)
    for step in lazy.steps:  # shares over bounds: still a distribution over the candidates
        assert math.isclose(sum(step.p), 1.0, abs_tol=1e-9)


def test_a_depth_reads_its_last_step_whole():
    query, texts = "q one", [f"passage {i} about q {i}" for i in range(20)]
    ranking = reranker(method="vanilla", depth=5).rerank(query, texts)
    assert ranking.decoded == 5 and len(ranking.steps) == 5
    assert ranking.steps[-1].pruned == 0  # the places below the depth follow its scores


def _prompts(calls: list) -> int:
    """How many prompts (trie nodes) the recorded ``/v1/completions`` requests asked (llama.cpp's prompt lists)."""
    bodies = [json.loads(c.content) for c in calls if c.url.path == "/v1/completions"]
    return sum(len(b["prompt"]) for b in bodies if isinstance(b["prompt"][0], list))
