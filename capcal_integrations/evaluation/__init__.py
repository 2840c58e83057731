"""``capcal eval``: rerank a benchmark with several methods; report quality, position bias and cost."""
