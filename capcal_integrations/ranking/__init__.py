"""The flows of one ranking, free of I/O: a ranking is a generator (a ``Flow``) that yields the requests
it needs and receives their answers, run by :mod:`~capcal_integrations.transport.drivers`.

``strategies.py`` is ``rerank_flow``: validate, the trivial case, the probe, method ``auto``, passages
fitted to the context (``fitting.py``), the sliding window, permutation self-consistency. ``decoding.py``
decodes one window with constrained decoding; the rules it applies are one small module each:
``depth.py`` (how deep a ranking decodes, what fills the places below) and ``deadline.py`` (what a
ranking returns when its deadline passes). ``orders.py`` holds windows, borda, argsort, Kendall tau;
``progress.py`` counts the requests a flow asks for (rerank's progress callback).
"""
