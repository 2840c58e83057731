"""The content check (content_check.py, contrast.py): its statistic and sequential decision on the testbed's
model (seeded, fast), and the check as the library runs it: once per model and reading options, over
queries (not windows, not readings), off the request path, with results that say what ran.

The tests named ``test_finding_N_...`` are the regression tests of issue 22's ten findings."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import pathlib
import random
import time

import pytest

from capcal_integrations import InputError
from capcal_integrations.content_check.check import ContentDecision, decision_key, load_decision
from capcal_integrations.content_check.contrast import (
    Reading,
    agreement,
    alpha_of_readings,
    estimates,
    implied_order,
    reading_orders,
    summary,
)
from capcal_integrations.content_check.evidence import ALIGN_E, CAP, Evidence
from capcal_integrations.content_check.rules import DEFAULT_RULE
from capcal_integrations.endpoints.probe import fingerprint
from capcal_integrations.options import Options
from capcal_integrations.testbed import SCENARIOS, simulated_endpoint

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
N = 20
_RNG = random.Random(7)
# 0..3, like a first stage's lists: better passages more often near the top, many zeros, ties and misorderings
GRADES = [[min(3, max(0, round(2.2 - 3 * i / N + _RNG.gauss(0.0, 1.2)))) for i in range(N)] for _ in range(60)]


def reading(model, grades, k, scale=1.0, shared=()):
    """One query's four readings (and the empty prompt's) from the testbed's model, as the endpoint answers them;
    ``scale``: this list's noise multiplied; ``shared``: slot effects of this list, the same in every reading."""
    n = len(grades)
    model = model.replace(noise=model.noise * scale, noise_empty=model.noise_empty * scale)
    keys = [f"passage {k}-{i}" for i in range(n)]
    slots = []
    for r, order in enumerate(reading_orders(n)):
        logits = model.logits([grades[i] for i in order], f"list {k} reading {r}", [keys[i] for i in order])
        slots.append(tuple(x + (shared[j] if shared else 0.0) for j, x in enumerate(logits)))
    return Reading(tuple(slots), tuple(model.logits(None, f"empty {k}", ["x"] * n)))


def decide(model, seed, *, scale_sd=0.0, shared_sd=0.0, lengths=(N,), loud=None, own=False):
    """A sequential decision over fresh queries; ``loud``: the index of a query whose scores are inflated;
    ``own``: the model's content is a preference of its own (random per passage), not the grades."""
    rng = random.Random(seed)
    evidence = Evidence()
    k = 0
    while evidence.verdict is None:
        n = rng.choice(lengths)
        grades = GRADES[rng.randrange(len(GRADES))][:n]
        if own:
            grades = [rng.gauss(1.0, 1.0) for _ in range(n)]
        scale = math.exp(rng.gauss(0.0, scale_sd)) if scale_sd else 1.0
        shared = [rng.gauss(0.0, shared_sd) for _ in range(n)] if shared_sd else ()
        r = reading(model.replace(seed=seed * 1000 + k), grades, k, scale, shared)
        score, aligned, pairs = summary(r)
        evidence.add(1.0 if k == loud else score, aligned, pairs)
        k += 1
    return evidence


# --------------------------------------------------------------------------- the statistic

def test_the_four_readings_cancel_any_slot_effect_and_estimate_content_twice():
    b, c = [0.7, -1.0, 2.0, 0.1, 0.3, -0.4], [1.0, 0.0, 3.0, 2.0, 0.0, 1.0]
    slots = tuple(tuple(b[j] + c[o[j]] for j in range(6)) for o in reading_orders(6))
    e1, e2 = estimates(Reading(slots))
    assert e1 == e2 == [2 * (c[m] - c[m + 3]) for m in range(3)]
    assert sorted(reading_orders(7)[3]) == list(range(7))  # each reading is a permutation


@pytest.mark.parametrize("name", ["no-delta", "delta-0.5b", "delta-1.5b", "last-digit", "ties"])
def test_without_content_a_query_scores_zero_on_average(name):
    model = SCENARIOS[name].replace(s=0.0)
    scores = [agreement(reading(model.replace(seed=k), GRADES[k], k)) for k in range(60)]
    assert abs(sum(scores) / len(scores)) < 0.15  # sd of a score about .45: 3 standard errors of 60


def test_the_sequential_test_decides_either_way_and_stops_at_the_cap():
    reads = Evidence()
    while reads.verdict is None:
        reads.add(1.0)
    assert reads.verdict == "reads" and reads.queries == 9  # the fewest: each query at most doubles the evidence
    assert not Evidence().add(-1.0)  # one query never decides
    capped = Evidence(cap=5)
    for x in (0.3, 0.5, 0.2, 0.4, 0.35):
        capped.add(x)
    assert capped.verdict == "undecided" and capped.queries == 5


def test_implied_order_is_calibrated_decoding_on_the_first_step():
    p, q = [math.log(x) for x in (0.5, 0.3, 0.2)], [math.log(x) for x in (0.6, 0.2, 0.2)]
    assert implied_order(p, q, 0.0) == [0, 1, 2] and implied_order(p, q, 1.0) == [1, 2, 0]


def test_alpha_is_chosen_from_the_readings_and_ties_go_to_one():
    model = SCENARIOS["delta-0.5b"].replace(s=1.0)
    alpha, curve = alpha_of_readings([reading(model.replace(seed=k), GRADES[k], k) for k in range(6)])
    assert alpha in curve and curve[alpha] == max(curve.values())
    assert alpha_of_readings([])[0] == 1.0


# --------------------------------------------------------------------------- issue 22's findings, on the statistic

def test_finding_6_false_reads_hold_when_noise_differs_between_lists():
    """Each list's noise scaled by exp(N(0, 1)): the old pooled permutation test passed 7.7 % at the 1 % level."""
    model = SCENARIOS["no-delta"].replace(s=0.0)
    verdicts = [decide(model, seed, scale_sd=1.0).verdict for seed in range(60)]
    assert verdicts.count("reads") <= 2  # expected at most .6 (1 %); the benchmark measures it on 2,000


def test_finding_7_one_loud_list_cannot_decide_alone():
    """The 1.5B's "weak reader" was one list carrying the pooled statistic: here one query scores the most any
    can, the rest have no content; the decision is not "reads"."""
    model = SCENARIOS["delta-1.5b"].replace(s=0.0)
    for seed in range(10):
        assert decide(model, seed, loud=0).verdict != "reads"


def test_a_model_with_strong_preferences_of_its_own_is_not_called_a_reader():
    """Content read consistently (high agreement) that follows neither relevance nor the first stage, as the
    packaged 0.5B and 1.5B read DL19 (issue 22, finding 7: within-list slope .001). Their alignments have mean 0,
    so the alignment e-process that "reads" needs reaches ALIGN_E with probability at most 1 / ALIGN_E
    (Ville's inequality): the rule before it (a mean alignment above 0 when the agreement decides) said
    "reads" in 79 of these 100 runs. The real models' alignments swing between -1 and +1, which
    makes it rarer still (the next test)."""
    model = SCENARIOS["no-delta"].replace(s=1.0)
    runs = [decide(model, seed, own=True) for seed in range(100)]
    assert min(sum(r.scores) / r.queries for r in runs) > 0.5  # they do read something, consistently
    assert sum(r.verdict == "reads" for r in runs) <= 100 / ALIGN_E


def test_the_packaged_05b_recorded_readings_do_not_decide_reads():
    """The packaged 0.5B's own first-step readings of all 43 DL19 queries (per query: agreement, alignment, slot
    pairs; tests/fixtures/real-readings.json, written by ``python -m benchmarks.decisions real --fixture``): in DL19's
    own query order not "reads" ("does not read (undecided)" at the cap), and "reads" in at most 2 % of 500
    random query orders (8 of 500; the rule before this one said "reads" in all of them).

    Not asserted for the 1.5B, whose 20 recorded queries are in the same file: its alignments average +.32, a
    relevance reader's on the testbed, and it decides "reads" within them in 7.4 % of random orders (issue 22
    stays open on it: docs/content-check.md)."""
    recorded = json.loads((FIXTURES / "real-readings.json").read_text())

    def verdict(queries):
        evidence = Evidence()
        for score, aligned, pairs in queries:
            if evidence.add(score, aligned, pairs) is not None:
                break
        return evidence.verdict

    queries, rng = recorded["0.5b"], random.Random(0)
    assert verdict(queries) != "reads"
    reads = sum(verdict(rng.sample(queries, len(queries))) == "reads" for _ in range(500))
    assert reads <= 10, reads


def test_finding_8_list_level_slot_effects_shared_by_the_readings_do_not_hide_a_reader():
    """Slot effects of each list (sd .35, the 0.5B's) shared by its readings: the old test's power was .04 at
    s = .3; the four readings cancel them."""
    model = SCENARIOS["no-delta"].replace(s=0.3)
    runs = [decide(model, seed, shared_sd=0.35) for seed in range(20)]
    assert sum(r.verdict == "reads" for r in runs) >= 19
    null = [decide(SCENARIOS["no-delta"].replace(s=0.0), seed, shared_sd=0.35).verdict for seed in range(30)]
    assert null.count("reads") <= 1


def test_consistent_preferences_against_the_first_stage_are_not_reading():
    """A model that prefers the passages the retriever ranked lower, consistently (the packaged 0.5B's pattern on
    DL19: it reads something, not relevance): the readings agree, but their content runs against the given
    order, and calibrating it would bring the wrong passages up. Never "reads"."""
    model = SCENARIOS["no-delta"].replace(s=-1.0)
    runs = [decide(model, seed) for seed in range(10)]
    assert all(r.verdict == "does not read" and r.queries <= 12 for r in runs), [(r.verdict, r.queries) for r in runs]
    assert all(r.aligned < 0 and sum(r.scores) / len(r.scores) > 0.5 for r in runs)  # consistent, and against


# --------------------------------------------------------------------------- in the library, on the testbed

def lists(k=12, n=12, lengths=None):
    rng = random.Random(1)
    words = "flea cat dog lives years water heat sun moon river stone tree bird fish grass cloud salt iron".split()
    out = []
    for q in range(k):
        m = lengths[q] if lengths else n
        passages = [f"{words[(q + i) % len(words)]} {q}-{i} " + " ".join(rng.choice(words) for _ in range(10))
                    for i in range(m)]
        out.append((f"query {q}", passages, [min(3, max(0, round(2.2 - 3 * i / m + rng.gauss(0.0, 1.2)))) for i in range(m)]))
    return out


def completions(endpoint):
    return endpoint.server.stats.requests.get("/v1/completions", 0)


def rank_until_decided(rr, data):
    rankings = []
    for q, p, _ in data:
        rankings.append(rr.rerank(q, p))
        if rr.content_decision() is not None:
            break
    return rankings


def test_a_reader_is_decided_over_queries_and_ranked_calibrated_after(caplog):
    data = lists(16)
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker(check_wait=True)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        rankings = rank_until_decided(rr, data)
    decision = rr.content_decision()
    assert decision is not None and decision.reads and decision.verdict == "reads"
    assert decision.lists == len(rankings) <= 10
    assert all(r.kept_given_order and r.method == "given-order" for r in rankings[:-1])  # undecided: given order
    assert rankings[-1].method == "capcal" and not rankings[-1].kept_given_order  # decided on it: ranked by it
    assert sum("content check on" in r.message for r in caplog.records) == 1  # one log line
    copy = rr.with_options(method="first-token-capcal")
    assert copy.content_decision() is decision
    before = endpoint.server.stats.prompts
    ranking = asyncio.run(copy.arerank(*data[-1][:2]))
    assert endpoint.server.stats.prompts - before == 2  # the real and the empty prompt: no reading any more
    assert any("reads the passages" in n for n in ranking.notes)


def test_finding_1_lists_of_mixed_lengths_pool_as_queries():
    """A strong reader on lists of lengths 20, 19, ..., 5: the old check pooled readings of equal length only
    and decided "no content signal" on 0 lists."""
    data = lists(16, lengths=[20 - q for q in range(16)])
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    assert rr.content_decision() is not None and rr.content_decision().reads


def test_finding_2_short_lists_are_neither_read_nor_calibrated_before_the_decision():
    data = lists(6, n=3)
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker(check_wait=True)
    rr.capabilities()
    probed = completions(endpoint)
    rankings = [rr.rerank(q, p) for q, p, _ in data]
    assert rr.content_decision() is None
    assert all(r.order == (0, 1, 2) and r.kept_given_order and r.steps == () for r in rankings)
    assert all("shorter than 4 passages" in r.notes[0] for r in rankings)
    assert completions(endpoint) == probed  # nothing read, nothing decoded


def test_finding_3_a_long_list_is_one_query_not_its_windows():
    data = lists(1, n=60)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    ranking = rr.rerank(*data[0][:2])
    check = next(iter(rr._state.content.values()))
    assert check.evidence.queries == 1 and rr.content_decision() is None
    assert ranking.order == tuple(range(60)) and ranking.checked == (0,)
    rr.rerank(*data[0][:2])  # the same list again is not read again
    assert check.evidence.queries == 1


def test_finding_4_the_key_tells_weights_and_reading_options_apart():
    base = decision_key("qwen", "sha256:a", Options())
    assert decision_key("qwen", "sha256:b", Options()) != base  # same served name, other weights
    for change in ({"probability": "trie"}, {"decoding": "release"}, {"normalise": False}, {"top_logprobs": 50},
                   {"window": 10}, {"max_passage_words": 100}, {"template": "rank_gpt"}, {"placeholder": ""}):
        assert decision_key("qwen", "sha256:a", Options().replace(**change)) != base, change
    small = fingerprint({"model_path": "/cache/capcal/qwen2.5-coder-0.5b.gguf"}, [{"id": "m", "meta": {"size": 491}}])
    large = fingerprint({"model_path": "/cache/capcal/qwen2.5-coder-1.5b.gguf"}, [{"id": "m", "meta": {"size": 1100}}])
    assert small and large and small != large
    assert fingerprint({}, [{"id": "m", "root": "/models/a", "max_model_len": 4096}]) != fingerprint(
        {}, [{"id": "m", "root": "/models/b", "max_model_len": 4096}])


def test_finding_5_a_rewritten_decision_file_is_read_again_and_async_rankings_do_not_wait(tmp_path):
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    d = rr.content_decision()
    path = tmp_path / "decision.json"
    path.write_text(d.to_json())
    assert load_decision(str(path)).reads
    flipped = json.loads(d.to_json())
    flipped["reads"], flipped["verdict"] = False, "does not read"
    path.write_text(json.dumps(flipped))
    assert not load_decision(str(path)).reads  # the old loader cached the first read of a path

    endpoint = simulated_endpoint(data, s=2.0, seed=1)
    fresh = endpoint.reranker()  # readings in the background
    fresh.capabilities()
    ranking = asyncio.run(fresh.arerank(*data[0][:2]))
    # returned without waiting for its readings: one /tokenize (fitting the passages), no prompt read or decoded
    assert ranking.kept_given_order and ranking.usage.requests == 1 and ranking.usage.prompt_tokens == 0


def test_finding_9_a_non_reader_pays_nothing_in_quality_while_deciding():
    data = lists(CAP + 1)
    endpoint = simulated_endpoint(data, s=0.0, seed=0)
    rr = endpoint.reranker(check_wait=True)
    rankings = [rr.rerank(q, p) for q, p, _ in data]
    assert all(r.order == tuple(range(12)) for r in rankings)  # the given order, every list
    decision = rr.content_decision()
    assert decision is not None and not decision.reads
    before = completions(endpoint)
    rr.rerank(*data[0][:2])
    assert completions(endpoint) == before  # once decided, a list costs nothing


def test_finding_10_results_say_the_given_order_was_kept_and_a_warning_says_why(caplog):
    data = lists(CAP + 1)
    rr = simulated_endpoint(data, s=0.0, seed=0).reranker(check_wait=True)
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        for q, p, _ in data:
            rr.rerank(q, p)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "content check on" in r.message]
    assert len(warnings) == 1 and "keeps the given order" in warnings[0].message and "guard=None" in warnings[0].message
    ranking = rr.rerank(*data[0][:2])
    assert ranking.method == "given-order" and ranking.kept_given_order and ranking.steps == ()
    assert all(d["kept_given_order"] and not d["decoded"] and d["method"] == "given-order" for d in ranking.details())


def test_readings_are_taken_in_the_background_one_at_a_time():
    data = lists(20)
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker()
    for q, p, _ in data:
        ranking = rr.rerank(q, p)
        if ranking.method == "capcal":
            break
        assert ranking.kept_given_order and ranking.checked == ()  # returned at once, not read here
        check = next(iter(rr._state.content.values()))
        deadline = time.monotonic() + 10
        while check._busy and time.monotonic() < deadline:  # the background reading of this list
            time.sleep(0.01)
    decision = rr.content_decision()
    assert decision is not None and decision.reads and decision.lists <= 10


def test_check_lists_is_the_cap_and_check_wait_a_boolean():
    data = lists(4)
    rr = simulated_endpoint(data, s=0.0, seed=0).reranker(check_wait=True, check_lists=3)
    for q, p, _ in data[:3]:
        rr.rerank(q, p)
    decision = rr.content_decision()
    assert decision is not None and decision.verdict == "undecided" and not decision.reads and decision.lists == 3
    assert "undecided" in rr.rerank(*data[3][:2]).notes[0]
    for bad in (0, 2.5, True):
        with pytest.raises(InputError, match="check_lists"):
            rr.with_options(check_lists=bad)
    with pytest.raises(InputError, match="check_wait"):
        rr.with_options(check_wait="yes")
    assert Options().check_lists == CAP


def test_a_decision_round_trips_through_json_and_a_file(tmp_path):
    d = ContentDecision(True, "reads", 0.004, 250.0, 0.8, 9, 1.25, 1.0, ((1.0, 0.3), (1.25, 0.4)),
                        (("model", "m"), ("template", "t")))
    again = ContentDecision.from_json(d.to_json())
    assert again == d and again.saved
    path = tmp_path / "decision.json"
    path.write_text(d.to_json())
    assert load_decision(str(path)) == d
    for bad in ('{"reads": true}', "not json {", str(tmp_path / "missing.json"),
                json.dumps({"capcal_content_decision": 1, "reads": True})):
        with pytest.raises(InputError, match="saved content decision"):
            load_decision(bad)


def test_another_template_or_placeholder_is_decided_afresh():
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    assert rr.content_decision() is not None
    assert rr.with_options(template="rank_gpt").content_decision() is None
    other = rr.with_options(placeholder="nothing here")
    assert other.content_decision() is None
    assert "content check deciding" in other.rerank(*data[0][:2]).notes[0]


def test_a_saved_decision_is_used_by_a_new_process_where_it_applies(tmp_path, caplog):
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    saved = tmp_path / "decision.json"
    saved.write_text(rr.content_decision().to_json())
    fresh_endpoint = simulated_endpoint(data, s=2.0, seed=0)
    fresh = fresh_endpoint.reranker(decision=str(saved))
    ranking = fresh.rerank(*data[9][:2])
    assert fresh_endpoint.server.stats.prompts == 2  # decided already: no reading
    assert ", saved)" in ranking.notes[0] and fresh.content_decision().saved
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        other = fresh.with_options(template="rank_gpt", check_wait=True)
        assert "deciding" in other.rerank(*data[9][:2]).notes[0]
    assert any("deciding afresh" in r.message and "template" in r.message for r in caplog.records)


def test_a_saved_decision_for_other_weights_is_not_used(caplog):
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    saved = json.loads(rr.content_decision().to_json())
    saved["key"]["weights"] = "sha256:another"
    other = simulated_endpoint(data, s=2.0, seed=0).reranker(decision=json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        assert "deciding" in other.rerank(*data[8][:2]).notes[0] and other.content_decision() is None
    assert any("weights" in r.message for r in caplog.records)


def test_alpha_auto_uses_the_chosen_strength_and_a_retired_guard_number_means_the_check():
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True)
    rank_until_decided(rr, data)
    alpha = rr.content_decision().alpha
    assert {s.alpha for s in rr.rerank(*data[-1][:2]).steps} == {alpha}
    with pytest.warns(FutureWarning, match="per-list guard was retired"):
        old = rr.with_options(guard=2.0)
    assert old.options.guard == DEFAULT_RULE == "query"
    ranking = old.rerank(*data[-1][:2])  # the same decision: no rotated prompt, no z-score
    assert {s.alpha for s in ranking.steps} == {alpha}


def test_the_option_values():
    assert (Options().guard, Options().alpha, Options().decision, Options().check_wait) == ("query", "auto", None, False)
    assert Options.parse("guard", "content") == "content" and Options.parse("guard", "2") == 2.0
    assert Options.parse("alpha", "auto") == "auto"
    assert Options().replace(preset="release").alpha == "adaptive"  # the release's rule, as its code has it
    json.dumps(Options().settings(), default=str)


def test_without_the_check_no_list_costs_a_reading_and_auto_alpha_is_one():
    data = lists()
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker(guard=None)
    ranking = rr.rerank(*data[0][:2])
    assert endpoint.server.stats.prompts == 2 and {s.alpha for s in ranking.steps} == {1.0}
    assert rr.content_decision() is None and not ranking.notes


def test_the_default_calibrates_a_model_that_reads_despite_slot_effects():
    """The 0.5B model's real-vs-empty slot mismatch and a model that reads (2 logits per grade): once decided,
    the default calibrates every list."""
    data = lists(24)
    rr = simulated_endpoint(data, s=2.0, scenario="delta-0.5b", seed=1).reranker(check_wait=True)
    rankings = rank_until_decided(rr, data)
    assert rr.content_decision().reads and len(rankings) <= 10
    assert not any(rr.rerank(q, p).kept_given_order for q, p, _ in data[len(rankings):])


def _idle(rr, seconds=10.0):
    """Wait until no content-check reading of ``rr`` is in flight."""
    deadline = time.monotonic() + seconds
    while any(c._busy for c in rr._state.content.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_readings_survive_asyncio_run_per_query_and_run_on_a_loop_of_their_own_for_async_only_transports():
    from capcal_integrations import CapCalReranker

    data = lists(20)
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker()  # a sync transport too: readings in a thread, which outlives each asyncio.run
    for q, p, _ in data:
        asyncio.run(rr.arerank(q, p))
        _idle(rr)
        if rr.content_decision() is not None:
            break
    assert rr.content_decision() is not None and rr.content_decision().reads
    only = CapCalReranker(base_url=endpoint.base_url, api_key="testbed", max_retries=0,
                          async_http_client=endpoint.async_http_client)  # nothing to send sync requests through

    async def rank_all():
        for q, p, _ in data:
            await only.arerank(q, p)
            while any(c._busy for c in only._state.content.values()):  # the reading, on the library's own loop
                await asyncio.sleep(0.01)
            if only.content_decision() is not None:
                return

    asyncio.run(rank_all())
    assert only.content_decision() is not None and only.content_decision().reads


def test_wait_for_readings_returns_once_the_lists_handed_over_are_read():
    data = lists(20)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker()
    assert rr.wait_for_readings(timeout=0)  # nothing handed over yet
    for q, p, _ in data[:2]:
        assert rr.rerank(q, p).kept_given_order  # returned at once; its list goes to the reading thread
        assert rr.wait_for_readings(timeout=60)
        check = next(iter(rr._state.content.values()))
        assert not check._busy  # nothing read or queued any more
    assert check.evidence.queries == 2  # both lists were read, one each time
