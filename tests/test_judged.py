"""Deciding from judged queries (issue 33, item 1): CapCalReranker.decide / adecide and capcal decide, on the
testbed's simulated server (the library's whole path), and the rule's statistics."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random

import pytest
from scipy import stats

from capcal_integrations import CapCalReranker
from capcal_integrations.content_check.check import ContentDecision
from capcal_integrations.content_check.judged import LabelEvidence, judged_triples, ndcg10, paired_interval, t_quantile
from capcal_integrations.errors import InputError
from capcal_integrations.testbed import simulated_endpoint

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon "
         "phi chi psi omega river stone cloud field").split()


def judged(n_queries: int, n: int = 8, seed: int = 0, first: bool = False) -> list[tuple[str, list[str], list[int]]]:
    """Lists whose relevant passages sit at the bottom of the given order (so reading them up is a gain), or at
    its top (``first``: a good retriever, which a model that does not read can only make worse)."""
    rng = random.Random(seed)
    out = []
    for q in range(n_queries):
        passages = [f"Passage {q}-{j}: " + " ".join(rng.choice(WORDS) for _ in range(12)) for j in range(n)]
        grades = [0] * (n - 3) + [rng.choice((1, 2, 3)) for _ in range(3)]
        grades = grades[::-1] if first else grades
        out.append((f"question number {q} about {rng.choice(WORDS)}", passages, grades))
    return out


@pytest.fixture(autouse=True)
def _no_kept_decisions(monkeypatch):
    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", "off")


def test_t_quantiles_and_the_paired_interval_match_scipy():
    for df in (1, 3, 9, 19, 39):
        for p in (0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    diffs = [0.3, -0.1, 0.2, 0.05, 0.4, 0.0, 0.15]
    mean, low, high = paired_interval(diffs)
    ref = stats.t.interval(0.95, len(diffs) - 1, loc=sum(diffs) / len(diffs), scale=stats.sem(diffs))
    assert (low, high) == pytest.approx(ref, rel=1e-9) and mean == pytest.approx(sum(diffs) / len(diffs))


def test_the_one_sided_p_value_matches_the_t_test():
    cal, given = [0.5, 0.7, 0.4, 0.9, 0.6, 0.8], [0.4, 0.7, 0.1, 0.6, 0.6, 0.5]
    ev = LabelEvidence.of(cal, given, given)
    ref = stats.ttest_rel(cal, given, alternative="greater").pvalue
    assert ev.p_value() == pytest.approx(ref, rel=1e-6)
    assert ev.calibrate == (ev.low > 0)


def test_ndcg10_is_trec_evals():
    assert ndcg10([2, 1, 0], [0, 1, 3]) == 1.0
    assert ndcg10([0, 1, 2], [0, 1, 3]) == pytest.approx((1 / math.log2(3) + 3 / 2) / (3 + 1 / math.log2(3)))
    assert ndcg10(list(range(12)), [0] * 11 + [3]) == 0.0  # below the cut


@pytest.mark.parametrize("bad, says", [
    ([("q", ["a", "b"], [1])] * 5, "2 passages but 1 grades"),
    ([("q", ["a", "b"], [1, "2"])] * 5, "grades must be integers"),
    ([("q", ["a", "b"], [1, True])] * 5, "grades must be integers"),
    ([("q", ["a", "b"])] * 5, "triple"),
    ([(1, ["a", "b"], [1, 0])] * 5, "query must be a string"),
    ([("q", ["a", "b"], [1, 0])] * 4, "at least 5"),
    ([("q", ["a", "b"], [0, 0])] * 9, "0 usable"),
    ("not a sequence of triples", "sequence of"),
])
def test_bad_judged_input_is_a_clear_error(bad, says):
    with pytest.raises(InputError, match=says):
        judged_triples(bad)


def test_a_reader_is_calibrated_from_its_labels_and_every_reranker_on_the_key_uses_it(caplog):
    lists = judged(8)
    endpoint = simulated_endpoint(lists, s=2.0, scenario="no-delta", seed=1)
    reranker = endpoint.reranker()
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        decision = reranker.decide(lists)
    assert decision.reads and decision.verdict == "reads" and decision.judged == 8
    assert decision.gain_low > 0 and decision.gain_low <= decision.gain <= decision.gain_high
    assert "decision from 8 judged queries" in caplog.text
    # another reranker on the same endpoint and key ranks with it: no check, calibrated at once
    other = reranker.with_options(check_wait=True)
    ranking = other.rerank(*lists[0][:2])
    assert not ranking.kept_given_order and ranking.method == "capcal" and not ranking.checked
    assert "decided from 8 judged queries" in ranking.notes[0]
    assert other.content_decision() == decision
    # saved and handed on like any decision, typed on the way back
    again = ContentDecision.from_json(decision.to_json())
    assert (again.judged, again.gain, again.gain_low) == (8, decision.gain, decision.gain_low)


def test_a_model_that_does_not_read_keeps_the_given_order_after_its_labels(caplog):
    lists = judged(8, seed=2, first=True)
    endpoint = simulated_endpoint(lists, s=0.0, scenario="no-delta", seed=2)
    reranker = endpoint.reranker()
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        decision = reranker.decide(lists)
    assert not decision.reads and decision.verdict == "does not read" and decision.gain_low <= 0
    assert "judged queries" in caplog.text  # the pass-through is said at WARNING
    ranking = reranker.rerank(*lists[3][:2])
    assert ranking.kept_given_order and ranking.order == tuple(range(8))
    assert "kept in its given order" in ranking.notes[0]


def test_adecide_decides_the_same_as_decide():
    lists = judged(6, seed=3)
    sync = simulated_endpoint(lists, s=2.0, scenario="no-delta", seed=3).reranker().decide(lists)
    endpoint = simulated_endpoint(lists, s=2.0, scenario="no-delta", seed=3)
    reranker = CapCalReranker(base_url=endpoint.base_url, api_key="x", async_http_client=endpoint.async_http_client,
                              http_client=endpoint.http_client)
    async_ = asyncio.run(reranker.adecide(lists))
    assert (async_.reads, async_.gain, async_.gain_low) == (sync.reads, sync.gain, sync.gain_low)


def test_decide_refuses_what_it_cannot_decide():
    lists = judged(5)
    endpoint = simulated_endpoint(lists, s=1.0, seed=0)
    with pytest.raises(InputError, match="guard=None has no check"):
        endpoint.reranker(guard=None).decide(lists)
    with pytest.raises(InputError, match="does not calibrate"):
        endpoint.reranker(method="vanilla").decide(lists)


def test_capcal_decide_reads_a_data_folder(tmp_path, capsys):
    import gzip

    from capcal_integrations.commands import cli
    from capcal_integrations.commands.decide import judged_from

    lists = judged(6, seed=4)
    with gzip.open(tmp_path / "candidates.jsonl.gz", "wt") as f:
        for q, (query, passages, _) in enumerate(lists):
            f.write(json.dumps({"qid": f"q{q}", "query": query,
                                "candidates": [{"docid": f"d{q}-{j}", "text": t} for j, t in enumerate(passages)]}) + "\n")
    (tmp_path / "qrels.txt").write_text("".join(f"q{q} 0 d{q}-{j} {g}\n" for q, (_, _, grades) in enumerate(lists)
                                                for j, g in enumerate(grades) if g))
    read = judged_from(str(tmp_path), top=20)
    assert [(q, [d.text for d in p], g) for q, p, g in read] == lists
    assert len(judged_from(str(tmp_path), queries=2)) == 2
    args = cli.build_parser().parse_args(["decide", "--data", str(tmp_path), "--json"])
    endpoint = simulated_endpoint(lists, s=2.0, scenario="no-delta", seed=4)
    from capcal_integrations.commands.decide import run
    assert run(args, endpoint.reranker()) == 0
    out = ContentDecision.from_json(capsys.readouterr().out)
    assert out.judged == 6 and out.reads


@pytest.mark.e2e
def test_decide_on_the_real_server_sets_and_keeps_a_decision_from_labels(server_url, tmp_path, monkeypatch):
    from capcal_integrations.content_check.saved_decisions import Store
    from tests._samples import PASSAGES, QUERY

    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(tmp_path))
    flea = [0, 3, 0, 1, 0]  # PASSAGES' grades for QUERY
    lists = [(QUERY, PASSAGES[:4], flea[:4]), (QUERY + "?", PASSAGES[1:5], flea[1:5]),
             ("which fruit is rich in potassium", PASSAGES[:4], [0, 0, 3, 0]),
             ("where is the Eiffel Tower", PASSAGES[:4], [3, 0, 0, 0]),
             ("how did the stock market close on Tuesday", PASSAGES[1:5], [0, 0, 0, 3])]
    reranker = CapCalReranker(base_url=server_url, api_key="none")
    decision = reranker.decide(lists)
    assert decision.judged == 5 and decision.reads == (decision.gain_low > 0)
    assert -1 <= decision.gain_low <= decision.gain <= decision.gain_high <= 1
    assert Store(tmp_path).load(decision.key) == decision  # kept for the next process on these weights
    ranking = reranker.rerank(*lists[0][:2])
    assert ranking.notes[0].startswith("decided from 5 judged queries")
    assert ranking.kept_given_order == (not decision.reads)
