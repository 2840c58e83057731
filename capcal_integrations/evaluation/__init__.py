"""``capcal eval``: rerank a benchmark with several methods; report quality, position bias and cost.

The entry point is :func:`capcal_integrations.evaluation.command.main`; importing this package loads
nothing else (the core never imports it).
"""


def main(argv: list[str] | None = None) -> int:
    """``capcal eval`` (see :mod:`.command`)."""
    from .command import main as run

    return run(argv)


__all__ = ["main"]
