"""The calibration itself, free of I/O: ``formulas.py`` (normalise, entropy, the adaptive alpha,
additive and log calibration, shares, the order scores imply), ``certify.py`` (whether a label is certainly the
additive form's choice, from bounds: a lazy step's certificate) and ``strength.py`` (alpha chosen label-free:
the one grid, the agreement curve and its tie-break, Kendall's tau). ``choose_alpha``, which measures shuffle
consistency through a reranker, is ``capcal_integrations.tuning`` (a layer above: it runs the reranker).
"""


def __getattr__(name: str) -> object:  # the names of the module this folder replaced (capcal_integrations.calibration)
    from .._moved import forwarded

    return forwarded(__name__, __name__, f"{__name__}.formulas", name)
