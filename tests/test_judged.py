"""Deciding from judged queries (issue 33, item 1; issue 48, part 3): CapCalReranker.decide / adecide and capcal
decide, on the testbed's simulated server (the library's whole path); the betting e-process's validity under
re-use and skew; decisions pooled over calls and kept across processes; decisions saved before the record load."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random

import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.content_check import betting
from capcal_integrations.content_check.check import ContentDecision
from capcal_integrations.content_check.judged import LabelEvidence, fresh_judged, judged_identity, ndcg10, pooled
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


def _null_sequences(shape: str, runs: int, n: int, rng: random.Random) -> list[list[float]]:
    """``runs`` sequences of ``n`` differences in [-1, 1] with mean 0 (the null at its edge)."""
    draw = {
        "skewed .75": lambda: 0.05 if rng.random() < 0.75 else -0.15,  # +.05 w.p. .75, a loss otherwise: mean 0
        "skew -2.7": lambda: 0.3 * 0.098 / 0.902 if rng.random() < 0.902 else -0.3,  # skewness -2.70
        "two-point +-1": lambda: rng.choice((1.0, -1.0)),  # the widest
        "uniform": lambda: rng.uniform(-0.5, 0.5),
        "rare big gain": lambda: 0.9 if rng.random() < 0.1 else -0.1,  # positive skew
    }[shape]
    return [[draw() for _ in range(n)] for _ in range(runs)]


@pytest.mark.parametrize("shape", ["skewed .75", "skew -2.7", "two-point +-1", "uniform", "rare big gain"])
def test_the_e_process_crosses_under_the_level_at_any_number_of_looks(shape):
    """Ville's inequality, simulated: at a true mean gain of 0, looking after every difference up to 60 (the user
    who re-runs decide() after each new judged query and stops at the first "calibrate"), the e-process crosses
    in under 2 % of runs, a margin below the 2.5 % level (2,000 runs a shape, fixed seeds: 0, 0, 31, 7 and 3
    crossings; the widest shape, +-1, comes closest)."""
    rng = random.Random(f"null|{shape}")
    runs = _null_sequences(shape, 2000, 60, rng)
    crossed = sum(betting.crossing(d) > 0 for d in runs)
    assert crossed / len(runs) <= 0.02, (shape, crossed)


def test_the_confidence_sequence_covers_the_mean_at_every_count():
    rng = random.Random(7)
    missed = 0
    for run in _null_sequences("skew -2.7", 300, 40, rng):
        shifted = [d + 0.1 for d in run]  # mean .1
        missed += any(not (lo <= 0.1 <= hi) for lo, hi in (betting.interval(shifted[:t]) for t in (5, 10, 20, 40)))
    assert missed / 300 <= 0.05


def test_the_bet_and_its_interval_by_hand():
    # one bettor at fraction .5: d = .5, -.5 -> 1.25, .9375; two bettors (.5, 1): the mean of their products
    assert betting.e_process([0.5, -0.5], fractions=(0.5,)) == [1.25, 0.9375]
    assert betting.e_process([0.5, 0.5], fractions=(0.5, 1.0))[-1] == pytest.approx((1.25 ** 2 + 1.5 ** 2) / 2)
    # a fraction-.95 bettor on d = .9 crosses 40 at the sixth difference (1.855 ** 6 = 40.7), and stays crossed
    assert betting.crossing([0.9] * 6 + [-1.0] * 5, fractions=(0.95,)) == 6
    low, high = betting.interval([0.9] * 6, fractions=(0.95,))
    assert (1 + 0.95 * (0.9 - low) / (1 + low)) ** 6 == pytest.approx(40, rel=1e-6)  # the lower end: wealth 40 there
    assert (1 + 0.95 * (high - 0.9) / (1 - high)) ** 6 == pytest.approx(40, rel=1e-6)
    ev = LabelEvidence.of([0.9] * 12, [0.1] * 12, [0.1] * 12)  # d = .8 twelve times: the library's mixture crosses
    assert ev.calibrate and ev.crossed == betting.crossing([0.8] * 12) and ev.low > 0 and ev.p_value() < 0.025
    with pytest.raises(InputError, match=r"\[-1, 1\]"):
        betting.e_process([1.5])


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
    ([(f"q{i}", ["a", "b"], [1, 0]) for i in range(4)], "at least 5"),
    ([("q", ["a", "b"], [1, 0])] * 5, "1 not judged before"),  # one query five times counts once
    ([("q", ["a", "b"], [0, 0])] * 9, "0 usable"),
    ("not a sequence of triples", "sequence of"),
])
def test_bad_judged_input_is_a_clear_error(bad, says):
    with pytest.raises(InputError, match=says):
        fresh_judged(bad, (("model", "m"),), None)


def test_a_reader_is_calibrated_from_its_labels_and_every_reranker_on_the_key_uses_it(caplog):
    lists = judged(16)
    endpoint = simulated_endpoint(lists, s=2.0, scenario="no-delta", seed=1)
    reranker = endpoint.reranker()
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        decision = reranker.decide(lists)
    assert decision.reads and decision.verdict == "reads" and decision.judged == 16 and 0 < decision.crossed <= 16
    assert decision.gain_low > 0 and decision.gain_low <= decision.gain <= decision.gain_high
    assert decision.p_value <= betting.LEVEL  # 1 / the e-process's highest: it reached 40
    assert "decision from 16 judged queries" in caplog.text and "anytime interval" in caplog.text
    # another reranker on the same endpoint and key ranks with it: no check, calibrated at once
    other = reranker.with_options(check_wait=True)
    ranking = other.rerank(*lists[0][:2])
    assert not ranking.kept_given_order and ranking.method == "capcal" and not ranking.checked
    assert "decided from 16 judged queries" in ranking.notes[0]
    assert other.content_decision() == decision
    # saved and handed on like any decision, typed on the way back, its record with it
    again = ContentDecision.from_json(decision.to_json())
    assert (again.judged, again.gain, again.gain_low, again.crossed) == (16, decision.gain, decision.gain_low,
                                                                          decision.crossed)
    assert again.judged_ids == decision.judged_ids and again.judged_scores == decision.judged_scores


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

    lists = judged(16, seed=4)
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
    assert out.judged == 16 and out.reads


def test_decide_twice_on_the_same_key_pools_the_queries_on_the_fake_endpoint():
    """Issue 48: a second decide() pools with the first (one sequential test over both calls' queries) instead of
    replacing it; a query judged before is not ranked again and keeps its first result."""
    from capcal_integrations.testing import clients, make_handler

    calls: list = []
    sync, async_ = clients(make_handler(calls=calls))
    reranker = CapCalReranker(client=sync, async_client=async_)
    lists = judged(9, seed=6)
    first = reranker.decide(lists[:5])
    assert first.judged == 5 and len(first.judged_ids) == len(first.judged_scores) == 5
    second = reranker.decide(lists[3:9])  # 3 and 4 judged before: 4 new
    assert second.judged == 9 and second.judged_ids[:5] == first.judged_ids
    assert second.judged_scores[:5] == first.judged_scores  # the first results stand
    assert second.judged_ids == tuple(judged_identity(first.key, q) for q, _, _ in lists)
    assert reranker.content_decision() == second
    # nothing new: no request, the decision as it was
    before = len(calls)
    assert reranker.decide(lists[2:7]) == second and len(calls) == before
    # the pooled test is the library's test over all nine in order
    assert second.crossed == betting.crossing([c - g for c, g, _ in second.judged_scores])


def test_pooled_decisions_are_kept_across_processes_and_a_calibrate_stays(tmp_path, monkeypatch):
    """The saved file keeps the pooled record: a later process (a fresh endpoint state) pools into it; once the
    e-process has crossed, queries where calibrating loses add to the record but do not undo the decision."""
    import json as json_

    from capcal_integrations.content_check.saved_decisions import Store, key_id
    from tests.test_decisions import Served

    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(tmp_path))
    gains, losses = judged(24, seed=8), judged(6, seed=9, first=True)
    losses = [(f"a good retriever's query {i}", p, g) for i, (_, p, g) in enumerate(losses)]
    served = Served(gains + losses, s=2.0, seed=3)
    first = served.reranker().decide(gains[:6])
    assert first.judged == 6 and not first.reads  # six queries cannot reach 40
    saved = json_.loads((tmp_path / f"{key_id(first.key)}.json").read_text())["decision"]
    assert saved["judged"] == 6 and len(saved["judged_ids"]) == 6 and len(saved["judged_scores"]) == 6
    # another process on the same weights and options: its check loads the saved record and pools into it
    later = Served(gains + losses, s=2.0, seed=3).reranker()
    pooled_ = later.decide(gains[4:24])  # 4 and 5 judged before
    assert pooled_.judged == 24 and pooled_.judged_ids[:6] == first.judged_ids and pooled_.reads
    saved = json_.loads((tmp_path / f"{key_id(first.key)}.json").read_text())["decision"]
    assert saved["judged"] == 24 and len(saved["judged_ids"]) == 24 and saved["crossed"] == pooled_.crossed
    after = later.decide(losses)
    assert after.judged == 30 and after.reads and after.crossed == pooled_.crossed
    assert Store(tmp_path).load(first.key) == after


def test_a_decision_saved_before_the_record_loads_and_is_replaced_not_pooled(tmp_path):
    """Back-compat: a saved judged decision without judged_ids / judged_scores / crossed (written before issue 48)
    still loads, as a decision with no pooled record; the next decide() replaces it."""
    from capcal_integrations.content_check.saved_decisions import Store, key_id

    key = (("model", "m"), ("weights", "sha256:1"))
    old = {"capcal_content_decision": 2, "reads": True, "verdict": "reads", "p_value": 0.01, "e_value": 1.0,
           "score": 0.2, "lists": 8, "alpha": 1.0, "alpha_first_token": 1.0, "curve": [], "key": dict(key),
           "level": 0.01, "aligned": 1.0, "e_aligned": 1.0, "judged": 8, "gain": 0.2, "gain_low": 0.05,
           "gain_high": 0.35, "uncalibrated_gain": 0.1}
    loaded = ContentDecision.from_json(json.dumps(old))
    assert loaded.reads and loaded.judged == 8 and loaded.judged_ids == () and loaded.crossed == 0
    assert "t interval" in loaded.labels_note()
    (tmp_path / f"{key_id(key)}.json").write_text(json.dumps(
        {"capcal_saved_decision": 1, "id": key_id(key), "source": "labels", "saved_at": "2026-12-01T00:00:00+00:00",
         "decision": {k: v for k, v in old.items() if k != "capcal_content_decision"} | {"capcal_content_decision": 2}}))
    assert Store(tmp_path).load(key) == loaded
    new = ContentDecision(False, "does not read", 1.0, 1.0, 0.0, 5, 1.0, 1.0, (), key, judged=5,
                          judged_ids=tuple("abcde"), judged_scores=((0.5, 0.5, 0.5),) * 5)
    assert pooled(loaded, new) == new  # no record to pool with: replaced
    assert fresh_judged([(f"q{i}", ["a", "b"], [1, 0]) for i in range(5)], key, loaded)[1] != []


@pytest.mark.e2e
def test_decide_on_the_real_server_sets_and_keeps_a_decision_from_labels(server_url, tmp_path, monkeypatch):
    from capcal_integrations.content_check.saved_decisions import Store
    from tests._samples import PASSAGES, QUERY

    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(tmp_path))
    flea = [0, 3, 0, 1, 0]  # PASSAGES' grades for QUERY
    # QUERY + "?" would be QUERY again (a query's words, folded): the second question is another one
    lists = [(QUERY, PASSAGES[:4], flea[:4]), ("in a few words: " + QUERY, PASSAGES[1:5], flea[1:5]),
             ("which fruit is rich in potassium", PASSAGES[:4], [0, 0, 3, 0]),
             ("where is the Eiffel Tower", PASSAGES[:4], [3, 0, 0, 0]),
             ("how did the stock market close on Tuesday", PASSAGES[1:5], [0, 0, 0, 3])]
    reranker = CapCalReranker(base_url=server_url, api_key="none")
    decision = reranker.decide(lists)
    assert decision.judged == 5 and decision.reads == (decision.gain_low > 0) and len(set(decision.judged_ids)) == 5
    assert not decision.reads  # five queries cannot reach 40, whatever they show
    assert -1 <= decision.gain_low <= decision.gain <= decision.gain_high <= 1
    assert Store(tmp_path).load(decision.key) == decision  # kept for the next process on these weights
    ranking = reranker.rerank(*lists[0][:2])
    assert ranking.notes[0].startswith("decided from 5 judged queries")
    assert ranking.kept_given_order == (not decision.reads)
