"""The certificate of a lazy CapCal step (calibration/certify.py): a certified label is the whole reading's choice at
every point of the box, for the additive form normalised and raw, fixed and adaptive strength; and the certificate
loosened (a normaliser's least value dropped, one end of alpha's interval checked) is caught by the same search."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capcal_integrations.calibration import certify
from capcal_integrations.calibration.certify import alpha_bounds, certified, entropy_bounds, rival_slacks
from capcal_integrations.calibration.formulas import adaptive_alpha, calibrate, entropy, normalise, order_of_scores


def whole_choice(a, b, alpha, normalise_shares):
    """The whole reading's choice from the values themselves (``alpha`` None: adaptive)."""
    shares_p = normalise(a)
    p, q = (shares_p, normalise(b)) if normalise_shares else (a, b)
    return order_of_scores(calibrate(p, q, adaptive_alpha(shares_p) if alpha is None else alpha))[0]


def completion(box, rng_or_units):
    """A point of the box: each unread label at ``unit`` times its bound."""
    return [lo if lo == hi else hi * u for (lo, hi), u in zip(box, rng_or_units)]


def contradiction(real, empty, alpha, normalise_shares, units_a, units_b, certify_fn=certified):
    """A label the certificate certifies that is not the whole reading's choice at this completion (else None)."""
    a, b = completion(real, units_a), completion(empty, units_b)
    if sum(a) <= 0 or sum(b) <= 0:
        return None  # the whole reading cannot normalise nothing
    interval = (alpha, alpha) if alpha is not None else alpha_bounds(real)
    for c in range(len(real)):
        if certify_fn(c, real, empty, interval, normalise=normalise_shares):
            choice = whole_choice(a, b, alpha, normalise_shares)
            if choice != c:
                return c, choice
    return None


label = st.tuples(st.floats(1e-4, 1.0), st.booleans())  # (upper bound, read through)
unit = st.sampled_from([0.0, 1.0]) | st.floats(0.0, 1.0)


@settings(max_examples=600, deadline=None)
@given(st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.lists(label, min_size=n, max_size=n), st.lists(label, min_size=n, max_size=n),
    st.lists(unit, min_size=n, max_size=n), st.lists(unit, min_size=n, max_size=n))),
    st.one_of(st.none(), st.floats(0.0, 3.0)), st.booleans())
def test_random_boxes_and_completions_never_contradict_a_certified_choice(drawn, alpha, normalise_shares):
    reals, empties, units_a, units_b = drawn
    real = [(hi if read else 0.0, hi) for hi, read in reals]
    empty = [(hi if read else 0.0, hi) for hi, read in empties]
    assert contradiction(real, empty, alpha, normalise_shares, units_a, units_b) is None


def random_case(rng, n_max=6):
    n = rng.randint(2, n_max)
    real = [(hi, hi) if rng.random() < .6 else (0.0, hi) for hi in (rng.random() ** 2 for _ in range(n))]
    empty = [(hi, hi) if rng.random() < .5 else (0.0, hi) for hi in (rng.random() for _ in range(n))]
    alpha = None if rng.random() < .5 else rng.choice([0.5, 1.0, 2.0])
    units = lambda: [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]  # noqa: E731
    return real, empty, alpha, rng.random() < .7, units(), units()


def search(certify_fn, trials=20_000, seed=0, first=True):
    """How many random cases the certificate certifies, and how many of them a completion contradicts (``first``:
    stop at the first contradiction)."""
    rng, certified_cases, wrong = random.Random(seed), 0, 0
    for _ in range(trials):
        real, empty, alpha, norm, ua, ub = random_case(rng)
        interval = (alpha, alpha) if alpha is not None else alpha_bounds(real)
        if any(certify_fn(c, real, empty, interval, normalise=norm) for c in range(len(real))):
            certified_cases += 1
            wrong += contradiction(real, empty, alpha, norm, ua, ub, certify_fn) is not None
            if wrong and first:
                break
    return certified_cases, wrong


def test_the_certificate_certifies_often_and_is_never_contradicted():
    certified_cases, wrong = search(certified, trials=8_000, first=False)
    assert wrong == 0 and certified_cases > 800  # not vacuous


def test_dropping_the_normalisers_least_value_is_caught(monkeypatch):
    # the mutant takes an unread label's mass at its bound in the normaliser whatever the sign of the difference
    exact = certify._least_share
    monkeypatch.setattr(certify, "_least_share", lambda top, rival, rest: exact(top, rival, (rest[1], rest[1])))
    assert search(certify.certified)[1] > 0


def test_checking_one_end_of_alphas_interval_is_caught():
    def high_end_only(c, real, empty, alpha, **kw):
        return certified(c, real, empty, (alpha[1], alpha[1]), **kw)

    def low_end_only(c, real, empty, alpha, **kw):
        return certified(c, real, empty, (alpha[0], alpha[0]), **kw)

    assert search(high_end_only)[1] > 0 and search(low_end_only)[1] > 0


def test_a_rival_bound_taken_too_low_is_caught():
    def rival_halved(c, real, empty, alpha, **kw):  # every unread rival's real bound taken at half its value
        halved = [(lo, hi if lo == hi or i == c else hi / 2) for i, (lo, hi) in enumerate(real)]
        return certified(c, halved, empty, alpha, **kw)

    assert search(rival_halved)[1] > 0


@pytest.mark.parametrize("seed", range(5))
def test_entropy_and_alpha_bounds_hold_every_completion(seed):
    rng = random.Random(seed)
    for _ in range(400):
        real, _, _, _, ua, _ = random_case(rng, n_max=9)
        a = completion(real, ua)
        if sum(a) <= 0:
            continue
        lo, hi = entropy_bounds(real)
        h = entropy(normalise(a))
        assert lo - 1e-12 <= h <= hi + 1e-12
        alo, ahi = alpha_bounds(real)
        assert alo - 1e-12 <= adaptive_alpha(normalise(a)) <= ahi + 1e-12


def test_all_read_the_slacks_are_the_score_differences():
    a, b = [.5, .2, .2, .1], [.1, .4, .3, .2]
    s = calibrate(normalise(a), normalise(b), 1.5)
    slacks = rival_slacks(0, [(x, x) for x in a], [(x, x) for x in b], (1.5, 1.5))
    assert slacks[0] == math.inf
    assert slacks[1:] == pytest.approx([s[0] - s[j] for j in (1, 2, 3)], abs=1e-12)
