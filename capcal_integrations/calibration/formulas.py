"""The maths of CapCal, as pure functions on plain floats.

All distributions are sequences of probabilities over the *remaining* candidates ``C_k`` of one
decoding step, in the same candidate order; logs are natural logs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import InputError

__all__ = ["FORMS", "normalise", "normalise_logprobs", "entropy", "adaptive_alpha", "calibrate", "calibrate_log",
           "calibrated", "shares", "order_of_scores"]

#: The calibration forms: the paper's additive correction and the log-space (contextual calibration) one.
FORMS = ("additive", "log")

#: The released rule ``alpha_k = min(BETA * H_k / log|C_k|, CAP)``.
ADAPTIVE_BETA = 5.0
ADAPTIVE_CAP = 2.0


def normalise(weights: Sequence[float]) -> list[float]:
    """Rescale non-negative weights to sum to one.

    >>> normalise([1.0, 3.0])
    [0.25, 0.75]
    """
    total = math.fsum(weights)
    if total <= 0.0:
        raise ValueError("cannot normalise weights that sum to zero")
    return [w / total for w in weights]


def normalise_logprobs(logprobs: Sequence[float]) -> list[float]:
    """Softmax of log-probabilities (renormalise joint label probabilities over ``C_k``).

    >>> [round(p, 3) for p in normalise_logprobs([math.log(0.1), math.log(0.3)])]
    [0.25, 0.75]
    """
    top = max(logprobs)
    return normalise([math.exp(lp - top) for lp in logprobs])


def entropy(p: Sequence[float]) -> float:
    """Shannon entropy in nats; ``0 log 0 = 0``.

    >>> round(entropy([0.5, 0.5]), 4)  # log 2
    0.6931
    >>> entropy([1.0, 0.0])
    0.0
    """
    return max(0.0, -math.fsum(x * math.log(x) for x in p if x > 0.0))


def adaptive_alpha(p: Sequence[float], *, beta: float = ADAPTIVE_BETA, cap: float = ADAPTIVE_CAP) -> float:
    """The released entropy-adaptive strength ``min(beta * H / log|C|, cap)``.

    A uniform ``p`` has normalised entropy 1, so alpha hits the cap; a one-hot ``p`` gives 0.

    >>> adaptive_alpha([0.25, 0.25, 0.25, 0.25])
    2.0
    >>> round(adaptive_alpha([0.97, 0.01, 0.01, 0.01]), 3)  # H = 0.1677, log 4 = 1.3863
    0.605
    """
    if len(p) < 2:
        return 0.0
    return min(beta * entropy(p) / math.log(len(p)), cap)


def calibrate(p: Sequence[float], q: Sequence[float], alpha: float) -> list[float]:
    """CapCal's additive correction ``S_i = p_i - alpha * (q_i - 1/|C|)``.

    ``p`` is the real stream's distribution, ``q`` the content-free (empty-passage) stream's.

    >>> calibrate([0.5, 0.3, 0.2], [0.6, 0.2, 0.2], 1.0)  # doctest: +ELLIPSIS
    [0.2333..., 0.4333..., 0.3333...]
    """
    if len(p) != len(q):
        raise ValueError(f"p and q differ in length ({len(p)} != {len(q)})")
    uniform = 1.0 / len(p)
    return [pi - alpha * (qi - uniform) for pi, qi in zip(p, q)]


def calibrate_log(p: Sequence[float], q: Sequence[float], alpha: float) -> list[float]:
    """The log-space ("diagonal" contextual-calibration) variant ``log p_i - alpha * log q_i``.

    Returned as a renormalised distribution so it is comparable with :func:`calibrate`.

    >>> [round(x, 3) for x in calibrate_log([0.5, 0.5], [0.8, 0.2], 1.0)]  # 0.5/0.8 : 0.5/0.2
    [0.2, 0.8]
    """
    if len(p) != len(q):
        raise ValueError(f"p and q differ in length ({len(p)} != {len(q)})")
    floor = 1e-12
    return normalise_logprobs([math.log(max(pi, floor)) - alpha * math.log(max(qi, floor)) for pi, qi in zip(p, q)])


def calibrated(p: Sequence[float], q: Sequence[float], alpha: float, form: str = "additive") -> list[float]:
    """:func:`calibrate` (``form="additive"``) or :func:`calibrate_log` (``form="log"``)."""
    if form == "additive":
        return calibrate(p, q, alpha)
    if form == "log":
        return calibrate_log(p, q, alpha)
    raise InputError(f"calibration form must be one of {', '.join(FORMS)}, got {form!r}")


def shares(scores: Sequence[float]) -> list[float]:
    """Calibrated scores clipped at zero and renormalised (uniform if none is positive): the share of
    the chosen candidate is its confidence.

    >>> shares([0.5, -0.2, 0.5]), shares([-1.0, -1.0])
    ([0.5, 0.0, 0.5], [0.5, 0.5])
    """
    clipped = [max(x, 0.0) for x in scores]
    total = math.fsum(clipped)
    return [x / total for x in clipped] if total > 0 else [1.0 / len(scores)] * len(scores)


def order_of_scores(scores: Sequence[float]) -> list[int]:
    """Indices by descending score; ties keep the earlier index first.

    >>> order_of_scores([0.1, 0.5, 0.2, 0.5])
    [1, 3, 2, 0]
    """
    return sorted(range(len(scores)), key=lambda j: (-scores[j], j))
