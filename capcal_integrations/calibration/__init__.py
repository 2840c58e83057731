"""The calibration itself, free of I/O: ``formulas.py`` (normalise, entropy, the adaptive alpha,
additive and log calibration, shares), ``strength.py`` (alpha chosen label-free: the one grid, the
agreement curve and its tie-break) and ``tuning.py`` (``choose_alpha``, public as
``capcal_integrations.choose_alpha``: shuffle consistency measured through a reranker).
"""


def __getattr__(name: str) -> object:  # the names of the module this folder replaced (capcal_integrations.calibration)
    from .._moved import forwarded

    return forwarded(__name__, __name__, f"{__name__}.formulas", name)
