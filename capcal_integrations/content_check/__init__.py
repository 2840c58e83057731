"""Does calibrating this model help? The decision the library takes on the user's behalf, and where it is kept.

``check.py`` holds the label-free check's state per model (name + weights) and reading options: the given
order while it decides, readings handed to a runner (``attempts.py``: lists read and being read, failures
retried with backoff), one place that sets a decision. ``judged.py`` decides from judged queries instead
(``CapCalReranker.decide``). ``rules.py`` is where a rule plugs in (the ``guard`` option names one);
``contrast.py`` (the per-list rule's statistic and the sequential test, ``Evidence``) and
``query_contrast.py`` (the default "query" rule's) are the rules. ``decision.py`` is what a decision is
(``ContentDecision``, its key); ``saved_decisions.py`` and ``saved_readings.py`` keep decisions and
checks in progress across processes (the only I/O here), read back as data by ``typed_json.py``.
"""


def __getattr__(name: str) -> object:  # the names of the module this folder replaced (capcal_integrations.content_check)
    from .._moved import forwarded

    return forwarded(__name__, __name__, f"{__name__}.check", name)
