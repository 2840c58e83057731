"""The label-free choice of alpha: hand-worked cases for the pure parts, one run against the real server."""

import asyncio

import pytest

from capcal_integrations import AlphaChoice, CapCalReranker, InputError, achoose_alpha, choose_alpha
from capcal_integrations.tuning import DEFAULT_ALPHAS, _choose, _jobs, calibrated_order, consistency
from capcal_integrations.types import Ranking, Step, Usage
from tests._samples import PASSAGES, QUERY


def _first_step_ranking(p, q):
    n = len(p)
    step = Step(tuple(range(n)), tuple(p), tuple(q), tuple(p), 1.0, 0.0, 0)
    return Ranking(tuple(range(n)), tuple(p), method="first-token-capcal", steps=(step,), usage=Usage(requests=2))


def _biased_model(perm, content, slot_bias):
    """A first step whose probability is content plus a preference for slots, renormalised."""
    raw = [content[d] + slot_bias[s] for s, d in enumerate(perm)]
    return [x / sum(raw) for x in raw]


def test_calibrated_order_additive_and_log():
    p, q = [0.5, 0.3, 0.2], [0.8, 0.1, 0.1]
    assert calibrated_order(p, q, 0.0) == [0, 1, 2]
    assert calibrated_order(p, q, 1.0) == [1, 2, 0]  # 0.5 - 0.467 < 0.3 + 0.233
    assert calibrated_order(p, q, 1.0, "log") == [1, 2, 0]  # 0.5/0.8 < 0.3/0.1
    with pytest.raises(InputError, match="form"):
        calibrated_order(p, q, 1.0, "cubic")


def test_choose_maps_slots_back_to_passages():
    # content alone decides and q is uniform: every shuffle ranks alike at every alpha
    content = [0.5, 0.3, 0.15, 0.05]
    jobs = _jobs([("q", ["a", "b", "c", "d"])], shuffles=3, seed=1, size=20)
    rankings = [_first_step_ranking(_biased_model(perm, content, [0, 0, 0, 0]), [0.25] * 4) for _, perm, _, _ in jobs]
    choice = _choose(jobs, rankings, DEFAULT_ALPHAS, "additive", 3)
    assert set(choice.curve.values()) == {1.0} and not choice.weak
    assert choice.alpha == 1.0  # ties go to the strength nearest 1
    assert (choice.queries, choice.shuffles, choice.usage.requests) == (1, 3, 6)


def test_choose_finds_the_strength_that_cancels_a_slot_bias():
    # slot 1 gets +0.1, more than the content gaps (0.05); the content-free stream shows the same
    # preference (q = .4/.2/.2/.2), so the additive form cancels it exactly at alpha 0.5
    content, bias = [0.3, 0.25, 0.2, 0.15], [0.1, 0.0, 0.0, 0.0]
    prior = _biased_model([0, 1, 2, 3], [0.1] * 4, bias)
    jobs = _jobs([("q", list("abcd")), ("r", list("wxyz"))], shuffles=4, seed=0, size=20)
    rankings = [_first_step_ranking(_biased_model(perm, content, bias), prior) for _, perm, _, _ in jobs]
    choice = _choose(jobs, rankings, (0.0, 0.5, 1.0, 2.0, 4.0), "additive", 4)
    assert choice.curve[0.0] < 1.0  # uncalibrated, whichever passage sits in slot 1 wins
    assert choice.alpha == 0.5 and choice.curve[0.5] == 1.0
    assert choice.curve[1.0] < 1.0 and choice.curve[4.0] < 1.0  # more overshoots
    assert "alpha=" in str(choice)


def test_a_model_without_content_signal_is_flagged(caplog):
    # the first step depends on the slot only: shuffles of a list rank its passages in unrelated orders
    jobs = _jobs([("q", list("abcdef"))], shuffles=4, seed=3, size=20)
    slot_only = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]
    rankings = [_first_step_ranking(slot_only, [1 / 6] * 6) for _ in jobs]
    choice = _choose(jobs, rankings, (0.0, 1.0), "additive", 4)
    assert choice.weak and "WEAK" in str(choice)
    assert "no alpha helps" in caplog.text


def test_consistency_needs_two_shuffles():
    with pytest.raises(InputError, match="two shuffles"):
        consistency([([0, 1], [0.5, 0.5], [0.5, 0.5])], 1.0)


@pytest.mark.parametrize(
    ("items", "kwargs", "match"),
    [
        ([], {}, "at least one"),
        ([("q", ["only one"])], {}, "at least 2"),
        ([("q", ["a", "b"])], {"shuffles": 1}, "shuffles"),
        ([("q", ["a", "b"])], {"alphas": ()}, "alphas"),
        ([("q", ["a", "b"])], {"alphas": (-1.0,)}, "alphas"),
    ],
)
def test_bad_inputs_fail_before_any_request(items, kwargs, match):
    rr = CapCalReranker(base_url="http://127.0.0.1:9/v1", max_retries=0)  # nothing listens there
    with pytest.raises(InputError, match=match):
        choose_alpha(rr, items, **kwargs)


@pytest.mark.e2e
def test_choose_alpha_on_the_real_server(server_url):
    rr = CapCalReranker(base_url=server_url)
    items = [(QUERY, PASSAGES), ("what is the capital of France", PASSAGES[:3] + ["Paris is the capital of France."])]
    choice = choose_alpha(rr, items, shuffles=3)
    assert isinstance(choice, AlphaChoice)
    assert list(choice.curve) == list(DEFAULT_ALPHAS)
    assert all(-1.0 <= t <= 1.0 for t in choice.curve.values())
    # the highest agreement; equal agreements (within rounding: 17/45 came out one ulp apart in CI) go to the
    # strength nearest 1, as calibration.strength.pick documents
    best = max(choice.curve.values())
    tied = [a for a, t in choice.curve.items() if t >= best - 1e-12]
    assert choice.alpha == min(tied, key=lambda a: (abs(a - 1.0), a))
    assert (choice.queries, choice.shuffles, choice.form) == (2, 3, "additive")
    assert choice.usage.requests >= 2 * 6  # both streams, six shuffled lists
    again = asyncio.run(achoose_alpha(rr, items, shuffles=3, alphas=(0.0, 1.0), form="log"))
    assert again.form == "log" and list(again.curve) == [0.0, 1.0]
    # alpha 0 does not depend on the form: the same (uncalibrated) first-step rankings, up to server drift
    assert abs(again.curve[0.0] - choice.curve[0.0]) <= 0.2


def test_a_strength_other_than_1_must_beat_it_by_the_margin():
    """With a margin (the content check's: MARGIN), strength.choose keeps alpha = 1 unless another strength agrees
    better by that many standard errors over the queries: consistently better on every query wins; better on
    average from a few disagreeing queries does not. Without one (choose_alpha), the highest agreement wins."""
    from capcal_integrations.calibration.strength import MARGIN, choose

    def query(kind: str):  # two readings of a two-passage list; "good": they agree at .5 and not at 1
        return [([0, 1], ("first", kind)), ([1, 0], ("second", kind))]

    def order_of(view, alpha):
        which, kind = view
        agree = (alpha == 0.5) == (kind == "good")
        return [0, 1] if which == "first" or not agree else [1, 0]

    assert MARGIN == 2.0
    assert choose([query("good")] * 5, order_of, (0.5, 1.0), MARGIN) == (0.5, {0.5: 1.0, 1.0: -1.0})
    noisy = [query("good"), query("good"), query("bad")]
    alpha, curve = choose(noisy, order_of, (0.5, 1.0), MARGIN)
    assert curve[0.5] > curve[1.0] and alpha == 1.0  # higher on average, not by 2 standard errors
    assert choose(noisy, order_of, (0.5, 1.0))[0] == 0.5
