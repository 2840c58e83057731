"""The ``capcal`` command and its subcommands (above the core: nothing in the core imports them).

``cli.py`` parses and dispatches (``capcal serve|rerank|tune|demo``; ``eval``, ``testbed``, ``decide`` and
``status``/``decisions`` handed to their modules); ``flags.py`` holds the flags the commands share (endpoint,
input, one per option); ``rerank.py`` (requests in, JSONL rankings out) hands batch runs to ``batch.py`` (Ray:
lists sharded over workers, resumable output, one content decision per run) and its lines to ``batchfile.py``;
``decide.py`` (a decision from judged queries), ``decisions.py`` (saved decisions and checks in progress) and
``demo.py`` (the default's result, then vanilla and CapCal forced) are one subcommand each.
"""
