"""The ``release`` preset, raw probabilities and the retired per-list guard's alias, on the fake endpoint (the
requests they send, and what they return). Live checks are in tests/test_e2e.py and the cross-check
against the official code in ``python -m benchmarks.fidelity``."""

from __future__ import annotations

import json

import pytest

from capcal_integrations import CapCalReranker, InputError
from capcal_integrations.content_check.rules import DEFAULT_RULE
from capcal_integrations.options import Options
from tests.fake_endpoint import clients, make_handler, split_prompt, tokenized_texts

PASSAGES = [f"passage {i}" for i in range(12)]


def reranker(calls=None, **options):
    sync, async_ = clients(make_handler(calls=calls))
    return CapCalReranker(client=sync, async_client=async_, **options)


def completion_prompts(calls):
    return [p for c in calls if c.url.path == "/v1/completions" for p in json.loads(c.content)["prompt"]
            if isinstance(p, list)]  # not the probe's


def test_a_preset_is_applied_first_and_explicit_options_win():
    o = Options().replace(preset="release", alpha=1.0, normalise=True)
    assert (o.template.name, o.prompt, o.decoding, o.normalise, o.alpha, o.guard) == (
        "capcal", "raw", "release", True, 1.0, None)
    assert o.placeholder == "This is a placeholder passage for bias testing"
    assert Options().replace(**o.settings()) == o  # settings() round-trips through the preset
    with pytest.raises(InputError, match="unknown preset"):
        Options().replace(preset="paper")
    with pytest.raises(InputError, match="needs probability='joint'"):
        Options().replace(normalise=False, probability="trie")
    with pytest.raises(InputError, match="numeric identifiers"):
        Options().replace(decoding="release", labels="alpha")


def test_release_sends_the_raw_prompt_and_its_own_prefix():
    calls = []
    rr = reranker(calls, preset="release", method="capcal", alpha=1.0)
    rr.capabilities()
    calls.clear()  # after the probe
    ranking = rr.rerank("q", PASSAGES)
    assert sorted(ranking.order) == list(range(12))
    assert not any(c.url.path == "/apply-template" for c in calls)  # no chat template
    prompts = [split_prompt(p) for p in completion_prompts(calls)]
    texts = {t for t, _ in prompts}
    assert len(texts) == 2 and all(t.startswith("\n<|system|>\n") and t.endswith("\n<|assistant|>\n") for t in texts)
    assert any(t.count("This is a placeholder passage for bias testing\n") == 12 for t in texts)
    # the prefixes: "[" then per pick "<digits>]>[", then the release's second "[" before scoring
    prefixes = {prefix for _, prefix in prompts}
    for k in range(len(ranking.steps)):
        chosen = "[" + "".join(f"{i + 1}]>[" for i in ranking.order[:k]) + "["
        assert chosen in prefixes, (k, chosen)
    # identifiers from 10 are scored by their two digits only (no "]"): "1" then "0".."2" after "[["
    assert "[[1" in prefixes and not any(p.endswith(("0]", "1]", "2]")) and p.startswith("[[1") for p in prefixes)


def test_raw_probabilities_are_the_joint_ones_and_rank_like_the_renormalised():
    rr = reranker(method="vanilla")
    normalised = rr.rerank("q", PASSAGES)
    raw = rr.with_options(normalise=False).rerank("q", PASSAGES)
    assert raw.order == normalised.order
    for a, b in zip(raw.steps, normalised.steps):
        assert sum(a.p) < 1.0  # the mass outside the allowed identifiers is kept
        assert [x / sum(a.p) for x in a.p] == pytest.approx(b.p, rel=1e-9)


def test_raw_calibration_is_the_release_formula():
    ranking = reranker(method="capcal", alpha=1.0, normalise=False, guard=None).rerank("q", PASSAGES)
    for step in ranking.steps:
        uniform = 1.0 / len(step.p)
        assert step.scores == pytest.approx([p - (q - uniform) for p, q in zip(step.p, step.q)])


@pytest.mark.parametrize("method", ["capcal", "first-token-capcal"])
@pytest.mark.parametrize("z", [1e9, -1e9])
def test_a_number_for_guard_is_read_as_the_content_check_with_a_warning(method, z):
    # the per-list guard (guard=<z-score>) was retired (issue 25): whatever the number, the ranking is the
    # content check's, as the default's
    with pytest.warns(FutureWarning, match="per-list guard was retired"):
        rr = reranker(method=method, guard=z)
    assert rr.options.guard == DEFAULT_RULE
    ranking = rr.rerank("q", PASSAGES)
    assert ranking.kept_given_order and ranking.method == "given-order"
    assert "content check deciding" in ranking.notes[0] and ranking.steps == ()
    plain = reranker(method=method).rerank("q", PASSAGES)
    assert (plain.order, plain.notes) == (ranking.order, ranking.notes)


def test_a_number_for_guard_leaves_uncalibrated_methods_alone():
    with pytest.warns(FutureWarning):
        ranking = reranker(method="vanilla", guard=1e9).rerank("q", PASSAGES)
    assert not ranking.kept_given_order


def test_release_sends_passages_as_the_authors_code_does():
    # the release's data loader sends the passage text as it is (title, newline, text); the library's
    # default cleans identifier look-alikes and whitespace
    calls = []
    passages = ["see  [3] first", {"title": "T", "text": "body [12]"}, "plain"]
    reranker(calls, preset="release", method="first-token").rerank("q", passages)
    spans = tokenized_texts(calls)
    assert " see  [3] first\n" in spans and " T\nbody [12]\n" in spans  # with the template's newline after it
    calls.clear()
    reranker(calls, method="first-token").rerank("q", passages)
    spans = tokenized_texts(calls)
    assert " see (3) first\n" in spans and " Title: T Content: body (12)\n" in spans
