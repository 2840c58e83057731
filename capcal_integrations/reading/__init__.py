"""Identifier probabilities read off an endpoint's answers, one module per way of reading them.

``readers.py``: one ``Reader`` per route (``prefix``, ``text``, ``generation``), what each can do; the flows ask
it instead of comparing route names.

``labels.py``: from the served model's token ids (the identifier trie, the nodes to ask, joint or
per-node probabilities). ``textlabels.py``: from token *texts* where ids are not exposed (hosted APIs,
Ollama), a walk read through the endpoint kind's next tokens or along the model's own answer, and a
generated ranking parsed. ``certified.py``: capcal's middle steps from the nodes a certified choice needs.
"""
