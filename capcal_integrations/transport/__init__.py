"""The only I/O of a ranking: HTTP requests and their answers.

``drivers.py`` runs a ranking's flow (``run_sync`` / ``run_async``): it sends the calls the flow yields,
throws typed errors into it, cancels siblings on failure and bounds requests by a deadline;
``transfer.py`` is one HTTP exchange (the body read incrementally, a wall-clock limit); ``client.py``
turns one configuration into the sync client and one async client per event loop; ``background.py`` reads
the content check's lists off the request path, on one thread per endpoint.
"""
