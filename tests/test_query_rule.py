"""The default content rule ``guard="query"`` (query_contrast.py): each order of a query's list read again
without the query, the test run on what the query adds. On the testbed's model (seeded, fast) and through the
library on the fake and simulated endpoints."""

from __future__ import annotations

import math
import random

import pytest

from capcal_integrations.content_check.check import decision_key
from capcal_integrations.content_check.contrast import Reading, agreement
from capcal_integrations.content_check.evidence import Evidence
from capcal_integrations.content_check.query_contrast import (
    SCALES,
    differences,
    judge,
    judge_scaled,
    reading_orders,
    relation,
    split,
    summary,
)
from capcal_integrations.content_check.query_contrast import (
    facts as query_facts,
)
from capcal_integrations.content_check.rules import RULES
from capcal_integrations.options import Options
from capcal_integrations.prompts.render import QUERY_PLACEHOLDER
from capcal_integrations.testbed import SCENARIOS, simulated_endpoint
from tests.fake_endpoint import split_prompt
from tests.test_content_check import GRADES, lists, rank_until_decided
from tests.test_release_and_guard import completion_prompts, reranker


def eight(model, grades, own, k):
    """One query's readings: the rule's orders with the query (content ``grades`` plus the model's own taste
    ``own``) and without it (its own taste only: no query to be relevant to); eight for a list of 20 or more."""
    n = len(grades)
    keys = [f"p{k}-{i}" for i in range(n)]

    def read(content, tag):
        return [tuple(model.logits([content[i] for i in o], f"q{k} {tag} {r}", [keys[i] for i in o]))
                for r, o in enumerate(reading_orders(n))]

    return Reading((*read([g + t for g, t in zip(grades, own)], "with"), *read(own, "free")))


@pytest.mark.parametrize("seed", range(3))
def test_a_taste_of_the_models_own_cancels_and_relevance_remains(seed):
    model = SCENARIOS["no-delta"].replace(s=1.0, seed=seed)
    rng = random.Random(seed)
    own = [[rng.gauss(0.0, 2.0) for _ in g] for g in GRADES]
    tasteful = [eight(model, [0] * len(g), t, k) for k, (g, t) in enumerate(zip(GRADES, own))]
    reader = [eight(model, g, t, k) for k, (g, t) in enumerate(zip(GRADES, own))]
    # the default rule's statistic calls a strong taste consistent content; what the query adds is noise (the
    # mean of 60 scores of sd about .5: within 3.5 standard errors of 0)
    assert sum(agreement(r) for r in tasteful) / 60 > 0.8
    assert abs(sum(summary(r)[0] for r in tasteful) / 60) < 0.25
    assert sum(summary(r)[0] for r in reader) / 60 > 0.5 and sum(summary(r)[1] for r in reader) / 60 > 0.1
    for verdict, readings in (("reads", reader), (None, tasteful)):
        evidence = Evidence(align_e=0.0)
        for r in readings:
            if evidence.add(*summary(r)) is not None:
                break
        assert (evidence.verdict == "reads") == (verdict == "reads"), (evidence.verdict, evidence.queries)


def test_a_reading_of_the_rule_is_eight_or_twelve_vectors():
    four = Reading(((0.0, 1.0, 2.0, 3.0),) * 4)
    with pytest.raises(ValueError, match="eight or twelve readings"):
        split(four)
    with pytest.raises(ValueError, match="four vectors"):
        Reading(((0.0,) * 4,) * 5)
    with_query, free = split(Reading((*four.slots, *((1.0, 1.0, 1.0, 1.0),) * 4)))
    assert with_query.slots == four.slots and free.slots == ((1.0,) * 4,) * 4
    assert [len(reading_orders(n)) for n in (4, 5, 19, 20, 30)] == [6, 6, 6, 4, 4]  # a third pair below 10 slot pairs


def test_the_query_free_readings_show_no_query_text():
    calls = []
    rr = reranker(calls, guard="query", check_wait=True)
    ranking = rr.rerank("a secret query about fleas", [f"passage {i}" for i in range(6)])
    assert ranking.checked == (0,)
    heads = {split_prompt(p)[0] for p in completion_prompts(calls)}  # each prompt once (asked with several prefixes)
    free = [h for h in heads if QUERY_PLACEHOLDER in h]
    # six passages (three slot pairs): the six orders with the query and the six without it (the empty prompt keeps
    # the query)
    assert len(free) == 6 and not any("secret query" in h for h in free)
    assert len([h for h in heads if "secret query" in h and "passage 0" in h]) == 6
    assert RULES["query"].query_free and not RULES["content"].query_free


def test_the_rule_decides_through_the_library_and_has_its_own_key():
    data = lists(30)
    reads = simulated_endpoint(data, s=2.0, seed=0).reranker(check_wait=True, guard="query")
    rank_until_decided(reads, data)
    decision = reads.content_decision()
    assert decision is not None and decision.reads and ("rule", "query-three-wide") in decision.key
    assert all(len(r.slots) == 12 for r in next(iter(reads._state.content.values())).readings)  # 12 passages: 3 pairs of orders
    taste = simulated_endpoint(data, s=0.0, preference=2.0, seed=0).reranker(check_wait=True, guard="query")
    rank_until_decided(taste, data)
    assert taste.content_decision() is None or not taste.content_decision().reads
    default, content = dict(decision_key("m", "w", Options())), dict(decision_key("m", "w", Options(guard="content")))
    assert default["rule"] == "query-three-wide"  # the default: its own decisions, not the content rule's saved ones
    # nor those of the rule before its gate over the scales 0.5-3 (issue 48)
    assert "rule" not in content  # the content rule's keys (and saved decisions) stay as they were


@pytest.mark.parametrize("n", [4, 7, 20, 30])
def test_a_querys_e_value_has_mean_one_over_the_sign_flips(n):
    """Without a query effect each estimate of what the query adds is as likely as its negative, independently:
    the e-value averaged over every sign pattern of the estimates is exactly 1, whatever their sizes (the rule's
    false "reads" at most 1 % rests on this). Short lists, read in three pairs of orders, can give up to 4; long
    ones, in two, up to 2 (one loud list cannot decide)."""
    import itertools

    rng = random.Random(n)
    k = len(reading_orders(n)) // 2
    for _ in range(20):
        ds = [[rng.gauss(0.0, 1.0) * rng.choice((0.1, 1.0, 30.0)) for _ in range(n // 2)] for _ in range(k)]
        es = [judge([[s * x for x in d] for s, d in zip(signs, ds)])[3]
              for signs in itertools.product((1, -1), repeat=k)]
        assert sum(es) / len(es) == pytest.approx(1.0)
        assert max(es) <= 2 ** (k - 1) + 1e-9
    same = [[1.0, -2.0, 0.5, 3.0, -1.0, 0.0, 2.0, -0.5, 1.5, -3.0][: n // 2]] * k
    assert judge(same)[3] > 1.4  # estimates that agree everywhere: well above 1


def test_a_reader_on_short_lists_reads_within_12_queries():
    """Lists of 4-9 passages (two to four slot pairs) are read in a third pair of orders, so that a reader at s = 1
    reads within 12 of them (issue 22's goal): 20 of 20 seeds here; betting on two estimates' score (the rule before)
    read in 33 of 40 (benchmarks/results/decisions-query.md: the mixed lengths 3-30)."""
    read = 0
    for seed in range(20):
        model = SCENARIOS["no-delta"].replace(s=1.0, seed=seed)
        rng = random.Random(seed)
        lists_ = [g[:rng.randint(4, 9)] for g in GRADES[:12]]
        readings = [eight(model, g, [0.0] * len(g), k) for k, g in enumerate(lists_)]
        assert all(len(r.slots) == 12 for r in readings)
        read += decided([summary(r) for r in readings]).verdict == "reads"
    assert read >= 19, read


def decided(facts):
    """The default rule's sequential test over these queries' ``(score, alignment, pairs)``, until it decides."""
    evidence = RULES["query"].evidence(40)
    for f in facts:
        if evidence.add(*f) is not None:
            break
    return evidence


@pytest.mark.parametrize("seed", range(3))
def test_a_query_effect_alike_in_every_pair_is_not_reading(seed):
    """What both packaged models' query effect looks like on DL19 (benchmarks/results/query-free-*.md): the query
    lifts the first stage's better half, every pair alike, whatever the passages say. Centred over the list's
    pairs, that shift scores 0 however large it is, and the rule never says "reads"; a reader still does. The
    model's own taste (SD 1, the same with and without the query) is consistent with the query, so the rule says
    "cannot tell" rather than "does not read": without labels that taste could be relevance that shows without the
    query."""
    model = SCENARIOS["no-delta"].replace(s=1.0, seed=seed)
    rng = random.Random(seed)
    own = [[rng.gauss(0.0, 1.0) for _ in g] for g in GRADES]
    lift = [[2.0 * (i < len(g) // 2) for i in range(len(g))] for g in GRADES]
    shifted = [eight(model, s_, t, k) for k, (s_, t) in enumerate(zip(lift, own))]
    reader = [eight(model, g, t, k) for k, (g, t) in enumerate(zip(GRADES, own))]
    assert abs(sum(summary(r)[0] for r in shifted) / 60) < 0.25 and sum(summary(r)[1] for r in shifted) / 60 > 0.5
    for verdict, readings in (("reads", reader), ("cannot tell", shifted)):
        evidence = decided([summary(r) for r in readings])
        assert evidence.verdict == verdict, (evidence.verdict, evidence.queries)


@pytest.mark.parametrize("model", ["0.5b", "1.5b"])
def test_the_packaged_models_query_effects_do_not_read(model):
    """Issue 22's goal on the real models: what the query adds to the packaged 0.5B's and 1.5B's DL19 readings
    (tests/fixtures/query-effects.json: the estimates with and without the query, written at commit 292d6a1 by
    ``benchmarks/query_free.py --fixture``) moves them the first stage's way but not toward relevance (calibrating
    them loses to BM25). The default rule says "reads" in at most 1 % of 500 random query orders (before centring:
    6.2 % and 99.4 %), and both in DL19's order "cannot tell": with the query they prefer a copy of what they prefer
    without it (a taste of their own, or relevance that shows without the query), which only labels tell apart."""
    import json
    import pathlib

    effects = json.loads((pathlib.Path(__file__).parent / "fixtures" / "query-effects.json").read_text())[model]
    facts = [query_facts(es, fs) for es, fs in effects]
    rng = random.Random(0)
    verdicts = [decided(rng.sample(facts, len(facts))).verdict for _ in range(500)]
    assert verdicts.count("reads") <= 5, verdicts.count("reads")
    in_order = decided(facts).verdict
    assert in_order == "cannot tell", in_order


def sharpened(model, own, scale, k, grades=None):
    """One query's readings from a model whose preference with the query is ``scale`` times its own query-free one
    (plus relevance ``grades``, if any)."""
    return copied(model, [scale * t + (g if grades else 0.0) for t, g in zip(own, grades or own)], own, k)


@pytest.mark.parametrize("scale", [1.3, 1.7])
def test_a_sharper_copy_of_the_models_own_taste_is_not_reading(scale):
    """Issue 33, finding 1: with the query, the packaged models prefer a sharper copy of what they prefer without it
    (1.31x the 0.5B, 1.67x the 1.5B). What the query adds at scale 1 then agrees from pair to pair, and the rule before
    read it as reading; at the least e-value over the scales (judge_scaled) such a model is a null, and a reader with
    the same taste still reads."""
    model = SCENARIOS["no-delta"].replace(s=1.0, seed=int(10 * scale))
    rng = random.Random(int(10 * scale))
    owns = [[rng.gauss(0.0, 1.0) for _ in g] for g in GRADES]
    tasteful = [sharpened(model, t, scale, k) for k, t in enumerate(owns)]
    reader = [sharpened(model, t, scale, k, [2.0 * x for x in g]) for k, (g, t) in enumerate(zip(GRADES, owns))]
    at_one = decided([judge(differences(r)) for r in tasteful])
    assert at_one.verdict == "reads", (at_one.verdict, at_one.queries)  # the rule before: a false "reads"
    for verdict, readings in (("reads", reader), ("cannot tell", tasteful)):
        evidence = decided([summary(r) for r in readings])
        assert evidence.verdict == verdict, (evidence.verdict, evidence.queries)
    assert min(SCALES) <= 1.0 <= scale <= max(SCALES)


def test_the_least_e_value_over_the_scales_has_mean_at_most_one_at_any_scale_in_range():
    """The guarantee in one line: for a model whose with-query preference is ``lambda`` times its query-free one plus
    symmetric noise, the rule's e-value is at most the sign-flip e-value at ``lambda`` (mean exactly 1), so its mean
    is at most 1 for every ``lambda`` in the range. Checked over every sign pattern of the noise."""
    rng = random.Random(7)
    for scale in (0.8, 1.0, 1.31, 1.67, 2.0):
        for es_of, fs in _scaled_copies(rng, scale):
            mean = sum(judge_scaled(es, fs)[3] for es in es_of) / len(es_of)
            assert mean <= 1.0 + 1e-9, (scale, mean)


def _scaled_copies(rng: random.Random, scale: float, draws: int = 10):
    """``draws`` times: a taste (SD 2, 10 passages) read twice query-free (``fs``), and the with-query readings
    ``scale`` times them plus noise, under every sign pattern of that noise (``es_of``)."""
    import itertools

    for _ in range(draws):
        own = [rng.gauss(0.0, 2.0) for _ in range(10)]
        fs = [[t + rng.gauss(0.0, 0.3) for t in own] for _ in range(2)]
        noise = [[rng.gauss(0.0, 0.3) for _ in own] for _ in range(2)]
        yield [[[scale * f + s * x for f, x in zip(fs[i], noise[i])] for i, s in enumerate(signs)]
               for signs in itertools.product((1, -1), repeat=2)], fs


def test_the_e_value_over_the_wider_range_has_mean_at_most_one_up_to_3x():
    """The taste gate's second e-value (``summary``'s last: the least over the scales 0.5-3) has mean at most 1 for a
    copy scaled by any factor up to 3, as the rule's own e-value (over 0.5-2) has up to 2; past 2 the rule's own does
    not (a copy sharper than 2x builds evidence there: the gate is what holds it back). Checked over every sign
    pattern of the noise."""
    rng = random.Random(48)
    past_two = []
    for scale in (0.5, 1.0, 2.0, 2.3, 2.7, 3.0):
        for es_of, fs in _scaled_copies(rng, scale):
            wide = sum(query_facts(es, fs)[7] for es in es_of) / len(es_of)
            assert wide <= 1.0 + 1e-9, (scale, wide)
            if scale > max(SCALES):
                past_two.append(sum(judge_scaled(es, fs)[3] for es in es_of) / len(es_of))
    assert min(past_two) > 1.2, min(past_two)  # the rule's own e-value alone: no guarantee past 2x


def test_a_weak_taste_sharpened_3x_never_reads():
    """Issue 48's last null cell: a taste too weak to see well without the query (SD .25 logits, about the readings'
    noise) that the query sharpens 3x. ``relation`` is estimated from noisy readings and averages well below .95 for
    it, so the relation gate alone let it through ("reads" in some of these runs: the gate before, ``wide_e`` and
    ``partial_e`` 0); the product of the e-values over the scales 0.5-3 holds it back (none), while its relation is
    too high for the partial gate."""
    res = []
    for run in range(40):
        model = SCENARIOS["no-delta"].replace(s=1.0, seed=480 + run)
        rng = random.Random(run)
        facts = []
        for k in range(40):
            grades = GRADES[rng.randrange(len(GRADES))]
            own = [0.25 * rng.gauss(0.0, 1.0) for _ in grades]
            facts.append(summary(copied(model, [3.0 * t for t in own], own, 1000 * run + k)))
        before = RULES["query"].evidence(40)
        before.wide_e = before.partial_e = 0.0
        for f in facts:
            if before.add(*f) is not None:
                break
        res.append((decided(facts).verdict, before.verdict))
    assert not [v for v, _ in res if v == "reads"], res
    assert sum(b == "reads" for _, b in res) >= 3, res  # the gate before: the cell's false "reads"
    assert all(v in ("cannot tell", "undecided") for v, _ in res), res


def test_a_reader_without_a_taste_reads_through_the_partial_gate():
    """A reader with no taste of its own (relation about 0) passes the taste gate on its relation (``for_partial``):
    its e-values over the wider range (0.5-3) subtract up to 3x its noisy query-free estimates, and waiting for their
    product alone delays its "reads" (here in 9 of 10 runs at s = .5, by up to 14 queries); never the other way."""
    runs = []
    for seed in range(10):
        model = SCENARIOS["no-delta"].replace(s=1.0, seed=seed)
        rng = random.Random(seed)
        facts = [summary(copied(model, [0.5 * g for g in grades], [0.0] * len(grades), k))
                 for k, grades in enumerate(rng.sample(GRADES, 40))]
        without = RULES["query"].evidence(40)
        without.partial_e = math.inf
        for f in facts:
            if without.add(*f) is not None:
                break
        rule = decided(facts)
        runs.append((rule.verdict, rule.queries, without.verdict, without.queries))
    assert all(v == "reads" for v, *_ in runs), runs
    assert all(q <= q_without for _, q, _, q_without in runs), runs
    assert sum(q < q_without for _, q, _, q_without in runs) >= 5, runs


def copied(model, with_query, free, k):
    """One query's readings from a model whose content with the query is ``with_query`` and without it ``free``
    (per passage, in the given order)."""
    n = len(free)
    keys = [f"p{k}-{i}" for i in range(n)]

    def read(values, tag):
        return [tuple(model.logits([values[i] for i in o], f"q{k} {tag} {r}", [keys[i] for i in o]))
                for r, o in enumerate(reading_orders(n))]

    return Reading((*read(with_query, "with"), *read(free, "free")))


COPIES = {  # issue 48's nulls: with the query, a copy of the query-free taste that no scale in 0.8-2 fits
    "sharpened non-linearly": lambda t, rng: math.copysign(abs(t) ** 1.5, t),
    "scaled per passage": lambda t, rng: 1.3 * math.exp(0.3 * rng.gauss(0.0, 1.0)) * t,
    "sharpened 2.5x": lambda t, rng: 2.5 * t,
}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_any_copy_of_the_models_own_taste_never_reads_and_says_it_cannot_tell(copy):
    """Issue 48, finding 1: with the query, a copy of the model's own taste that is no scaled copy in the rule's range
    (sharpened non-linearly, scaled per passage, sharpened past 2x) passed the rule before as reading (70-98 % false
    "reads" at own SD 1). The taste gate (``relation``: the query-free taste accounts for all of it) keeps "reads" out,
    and the model, which does prefer some passages consistently, is "cannot tell" or undecided at the cap (the
    evidence against reading grows slowly where what the query adds agrees from pair to pair), never "does not read":
    only labels tell such a taste from relevance."""
    model = SCENARIOS["no-delta"].replace(s=1.0, seed=48)
    rng = random.Random(copy)
    verdicts = []
    for run in range(3):
        owns = [[rng.gauss(0.0, 1.0) for _ in g] for g in GRADES]
        readings = [copied(model, [COPIES[copy](t, rng) for t in own], own, 100 * run + k) for k, own in enumerate(owns)]
        verdicts.append(decided([summary(r) for r in readings]).verdict)
    assert all(v in ("cannot tell", "undecided") for v in verdicts), verdicts


def test_a_reader_whose_passages_look_relevant_without_the_query_is_never_called_a_non_reader():
    """Issue 48, finding 2: the query-free prompt still shows half the relevance (passages that look relevant whatever
    the query). The rule before said "does not read" in every run; now "cannot tell" (a copy of what it prefers
    without the query: only labels tell), while a model with no preference at all "does not read"."""
    model = SCENARIOS["no-delta"].replace(s=1.0, seed=7)
    half = [copied(model, [float(g) for g in grades], [0.5 * g for g in grades], k) for k, grades in enumerate(GRADES)]
    flat = [copied(model, [0.0] * len(grades), [0.0] * len(grades), k) for k, grades in enumerate(GRADES)]
    assert decided([summary(r) for r in half]).verdict == "cannot tell"
    assert decided([summary(r) for r in flat]).verdict == "does not read"


def test_relation_is_one_for_a_copy_and_lower_for_relevance_on_top():
    """``relation`` uses products of different pairs of orders only: each reading's own noise drops out."""
    rng = random.Random(3)
    own = [rng.gauss(0.0, 1.0) for _ in range(10)]
    rel = [rng.gauss(0.0, 1.0) for _ in range(10)]
    noisy = lambda xs: [[x + rng.gauss(0.0, 0.05) for x in xs] for _ in range(2)]  # noqa: E731
    assert relation(noisy([2.0 * t for t in own]), noisy(own)) > 0.99
    assert relation(noisy([t + r for t, r in zip(own, rel)]), noisy(own)) < 0.9
    assert relation(noisy(rel), [[0.0] * 10] * 2) == 0.0  # no query-free preference: nothing to copy
