"""``capcal eval``: rerank a benchmark with several methods; report quality, position bias and cost."""

from .command import main

__all__ = ["main"]
