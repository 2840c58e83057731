"""The content check (content_check.py): its statistic's false passes under slot effects and ties and its
power, on the testbed's model (seeded, fast); and the decision as the library keeps it: once per model,
prompt and placeholder, shared by with_options copies and by the sync and async paths, reusable."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random

import pytest

from capcal_integrations import InputError
from capcal_integrations.calibration import content_agreement, normalise_logprobs
from capcal_integrations.content_check import (
    ContentDecision,
    Reading,
    choose_alpha,
    halves_swapped,
    implied_order,
    load_decision,
    paired_contrast,
)
from capcal_integrations.testbed import SCENARIOS, simulated_endpoint

N = 20
GRADES = [[(7 * i + 3 * k) % 4 if (i + k) % 3 else 0 for i in range(N)] for k in range(40)]  # 0..3, many zeros


def readings(name, s, seed, lists=8):
    """``lists`` readings (given, halves swapped, empty) from the testbed's model, as the endpoint answers them."""
    model = SCENARIOS[name].replace(s=s, seed=seed)
    swap = halves_swapped(N)
    out = []
    for k in random.Random(seed).sample(range(len(GRADES)), lists):
        g = GRADES[k]
        keys = [f"passage {k}-{i}" for i in range(N)]
        out.append(Reading(tuple(model.logits(g, f"list {k}", keys)),
                           tuple(model.logits([g[i] for i in swap], f"list {k} swapped", [keys[i] for i in swap])),
                           tuple(model.logits(None, f"empty {k}", ["x"] * N))))
    return out


def pass_rate(name, s, draws, level=0.01):
    return sum(paired_contrast(readings(name, s, seed), permutations=199).p_value <= level for seed in range(draws)) / draws


@pytest.mark.parametrize("name", ["no-delta", "delta-0.5b", "delta-1.5b", "last-digit", "ties"])
def test_without_content_it_passes_about_one_percent_whatever_the_slots_do(name):
    assert pass_rate(name, 0.0, 150) <= 0.04  # level .01: 1.5 expected of 150; 6 or more has p < .005


def test_the_per_list_guard_it_replaces_passes_a_last_digit_slot_effect():
    """The old statistic (rotation by half, calibrated scores' tau) cannot tell a slot effect shared by
    [j] and [j + 10] from content: the rotation moves each passage to a slot with the same last digit."""
    passes = 0
    for seed in range(40):
        for r in readings("last-digit", 0.0, seed, lists=1):
            q = normalise_logprobs(list(r.empty))
            passes += content_agreement(normalise_logprobs(list(r.real)), normalise_logprobs(list(r.swapped)), q, N // 2) >= 2
    assert passes / 40 > 0.5
    assert pass_rate("last-digit", 0.0, 40) <= 0.05


@pytest.mark.parametrize("name", ["no-delta", "delta-0.5b", "last-digit", "ties"])
def test_it_sees_half_a_logit_per_grade_in_eight_lists(name):
    assert pass_rate(name, 0.5, 40) >= 0.9


def test_it_needs_two_lists_of_one_length():
    one = readings("no-delta", 2.0, 0, lists=1)
    assert paired_contrast(one).p_value == 1.0 and paired_contrast(one).pairs == 0
    short = [Reading((0.0, 1.0, 2.0), (2.0, 1.0, 0.0))] * 3  # fewer than four passages: no pairs
    assert paired_contrast(short).p_value == 1.0


def test_implied_order_is_calibrated_decoding_on_the_first_step():
    p = [math.log(x) for x in (0.5, 0.3, 0.2)]
    q = [math.log(x) for x in (0.6, 0.2, 0.2)]
    assert implied_order(p, None, 1.0) == [0, 1, 2]
    assert implied_order(p, q, 1.0) == [1, 2, 0]  # step 1: .5-.27, .3+.13, .2+.13; step 2 over {0, 2}: .714-.25 vs .286+.25
    assert implied_order(p, q, 1.0, first_only=True) == [1, 2, 0]


def test_alpha_is_chosen_from_the_readings_and_ties_go_to_one():
    alpha, curve = choose_alpha(readings("no-delta", 1.0, 3))
    assert alpha in curve and curve[alpha] == max(curve.values())
    flat = [Reading((0.0,) * 4, (0.0,) * 4, (0.0,) * 4)] * 2  # every strength agrees equally
    assert choose_alpha(flat)[0] == 1.0
    assert choose_alpha([Reading((0.0,) * 4, (0.0,) * 4)]) == (1.0, {})  # no empty prompt: nothing to choose


def test_a_decision_round_trips_through_json_and_a_file(tmp_path):
    d = ContentDecision(True, 0.001, 12.5, 8, 1.25, 1.0, ((1.0, 0.3), (1.25, 0.4)), (("model", "m"), ("template", "t")))
    again = ContentDecision.from_json(d.to_json())
    assert again == d and again.saved
    path = tmp_path / "decision.json"
    path.write_text(d.to_json())
    assert load_decision(str(path)) == d
    for bad in ('{"reads": true}', "not json {", str(tmp_path / "missing.json")):
        with pytest.raises(InputError, match="saved content decision"):
            load_decision(bad)


# --------------------------------------------------------------------------- in the library, on the testbed

def lists(k=10):
    rng = random.Random(1)
    words = "flea cat dog lives years water heat sun moon river stone tree bird fish grass cloud salt iron".split()
    out = []
    for q in range(k):
        passages = [f"{words[(q + i) % len(words)]} {q}-{i} " + " ".join(rng.choice(words) for _ in range(10))
                    for i in range(12)]
        out.append((f"query {q}", passages, [rng.choice([0, 0, 1, 2, 3]) for _ in range(12)]))
    return out


def completions(endpoint):
    return endpoint.server.stats.requests.get("/v1/completions", 0)


def test_the_decision_is_taken_once_and_shared_by_copies_and_the_async_path(caplog):
    data = lists()
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker()
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        first = [rr.rerank(q, p) for q, p, _ in data[:8]]
    assert "content check pending (1 of 8 lists)" in first[0].notes[0]
    decision = rr.content_decision()
    assert decision is not None and decision.reads and decision.lists == 8
    assert sum("content check on 8 lists" in r.message for r in caplog.records) == 1  # one log line
    assert any("content check (8 lists, p = " in n and "reads the passages" in n for n in first[-1].notes)
    copy = rr.with_options(method="first-token-capcal")
    assert copy.content_decision() is decision
    before = endpoint.server.stats.prompts
    ranking = asyncio.run(copy.arerank(*data[8][:2]))
    assert endpoint.server.stats.prompts - before == 2  # the real and the empty prompt: no second reading
    assert any("content check (8 lists" in n for n in ranking.notes)


def test_check_lists_sets_how_many_lists_the_decision_pools():
    data = lists(12)
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker().with_options(check_lists=12)
    rankings = [rr.rerank(q, p) for q, p, _ in data[:12]]
    assert "content check pending (11 of 12 lists)" in rankings[10].notes[0]
    assert rr.content_decision() is not None and rr.content_decision().lists == 12
    assert [r.checked for r in rankings] == [(0,)] * 12  # each deciding list (one window) read a second time
    assert rr.rerank(*data[0][:2]).checked == ()  # decided: no second reading
    for bad in (1, 0, 2.5, True):
        with pytest.raises(InputError, match="check_lists"):
            rr.with_options(check_lists=bad)


def test_another_template_or_placeholder_is_decided_afresh():
    data = lists()
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker()
    for q, p, _ in data[:8]:
        rr.rerank(q, p)
    assert rr.content_decision() is not None
    assert rr.with_options(template="rank_gpt").content_decision() is None
    other = rr.with_options(placeholder="nothing here")
    assert other.content_decision() is None
    assert "content check pending (1 of 8 lists)" in other.rerank(*data[8][:2]).notes[0]


def test_a_model_that_does_not_read_keeps_the_given_order_at_no_cost_once_decided():
    data = lists()
    endpoint = simulated_endpoint(data, s=0.0, seed=0)
    rr = endpoint.reranker()
    for q, p, _ in data[:8]:
        rr.rerank(q, p)
    assert not rr.content_decision().reads
    before = completions(endpoint)
    ranking = rr.rerank(*data[8][:2])
    assert ranking.order == tuple(range(12)) and ranking.guarded == (0,)
    assert completions(endpoint) == before


def test_a_saved_decision_is_used_by_a_new_process_where_it_applies(tmp_path, caplog):
    data = lists()
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker()
    for q, p, _ in data[:8]:
        rr.rerank(q, p)
    saved = tmp_path / "decision.json"
    saved.write_text(rr.content_decision().to_json())
    fresh_endpoint = simulated_endpoint(data, s=2.0, seed=0)
    fresh = fresh_endpoint.reranker(decision=str(saved))
    ranking = fresh.rerank(*data[9][:2])
    assert fresh_endpoint.server.stats.prompts == 2  # decided already: no second reading
    assert ", saved)" in ranking.notes[0] and fresh.content_decision().saved
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        other = fresh.with_options(template="rank_gpt")
        assert "pending" in other.rerank(*data[9][:2]).notes[0]
    assert any("deciding afresh" in r.message for r in caplog.records)


def test_alpha_auto_uses_the_chosen_strength_and_the_per_list_guard_remains_an_option():
    data = lists()
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker()
    for q, p, _ in data[:8]:
        rr.rerank(q, p)
    alpha = rr.content_decision().alpha
    assert {s.alpha for s in rr.rerank(*data[8][:2]).steps} == {alpha}
    old = rr.with_options(guard=2.0, alpha="adaptive").rerank(*data[8][:2])
    assert len(old.agreement) == 1  # the per-list guard's z-score


def test_the_option_values():
    from capcal_integrations.options import Options

    assert (Options().guard, Options().alpha, Options().decision) == ("content", "auto", None)
    assert Options.parse("guard", "content") == "content" and Options.parse("guard", "2") == 2.0
    assert Options.parse("alpha", "auto") == "auto"
    assert Options().replace(preset="release").alpha == "adaptive"  # the release's rule, as its code has it
    json.dumps(Options().settings(), default=str)


def test_without_the_check_no_list_costs_a_second_reading_and_auto_alpha_is_one():
    data = lists()
    endpoint = simulated_endpoint(data, s=2.0, seed=0)
    rr = endpoint.reranker(guard=None)
    ranking = rr.rerank(*data[0][:2])
    assert endpoint.server.stats.prompts == 2 and {s.alpha for s in ranking.steps} == {1.0}
    assert rr.content_decision() is None and not ranking.notes


def test_the_default_calibrates_a_model_that_reads_despite_slot_effects():
    """The 0.5B model's real-vs-empty slot mismatch and a model that reads (2 logits per grade): the
    default calibrates (nearly) every list. The per-list guard it replaces kept most of them in their
    given order (its statistic read the mismatch as disagreement)."""
    data = lists(16)
    rr = simulated_endpoint(data, s=2.0, scenario="delta-0.5b", seed=1).reranker()
    kept = sum(bool(rr.rerank(q, p).guarded) for q, p, _ in data)
    assert kept <= 2


def test_a_saved_decision_for_another_model_is_not_used():
    data = lists()
    rr = simulated_endpoint(data, s=2.0, seed=0).reranker()
    for q, p, _ in data[:8]:
        rr.rerank(q, p)
    saved = json.loads(rr.content_decision().to_json())
    saved["key"]["model"] = "another-model"
    other = simulated_endpoint(data, s=2.0, seed=0).reranker(decision=json.dumps(saved))
    assert "pending" in other.rerank(*data[8][:2]).notes[0] and other.content_decision() is None
