"""A ranking's deadline (``Options.deadline``): the bookkeeping, kept apart from the flow and the drivers.

A chat turn has a second or two for its reranking. With ``deadline=s`` the drivers (:mod:`.drivers`)
bound each request by the time left (the sync driver as the request's timeout, the async driver by
cancelling the batch) and, when it passes, throw :class:`DeadlinePassed` into the flow instead of an
answer. The request is abandoned by closing its connection, which is how a llama.cpp or vLLM server is
told to stop the completion; the client's retries are off under a deadline (a retry would start after it).

The flow then returns what it has decided, and :func:`partial_order` puts the rest in first-stage
order: the places the model had chosen in the top window stay, best first; everything else follows in
the order it was given (a lower window's work does not decide any top place, so it is not used). The
ranking says so: ``Ranking.partial``, ``Ranking.decoded`` and a note (:func:`deadline_note`). Nothing is
silent: without a deadline nothing here runs, and with one the result always says whether it was cut.
A list of several windows (ranked bottom first, the top window last) keeps time for its top window: once
the time left is less than twice the slowest window so far, the lower windows not yet ranked are left out and
the top window is ranked next (:func:`deadline_skip_note`), so a long list under a deadline still has its
top places decided rather than none.
A deadline that passes before any decoding (probing, fitting the passages) returns the first-stage order the
same way (:func:`first_stage`, the last resort of :func:`~.strategies.rerank_flow`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..endpoints.calls import Flow
from ..types import Ranking

__all__ = ["Deadline", "DeadlinePassed", "partial_order", "deadline_note", "deadline_skip_note", "first_stage", "finish"]


class DeadlinePassed(Exception):  # noqa: N818 - a signal, not an error: it never reaches the caller
    """Thrown into a flow by a driver when the ranking's deadline passes before an answer came back.
    ``answered`` are the answers of the batch that did come back (their usage counts); ``abandoned`` how
    many requests were sent and then cut off (counted as requests, with no tokens reported)."""

    def __init__(self, answered: Sequence[Any] = (), abandoned: int = 0) -> None:
        super().__init__(f"deadline passed ({abandoned} request(s) abandoned)")
        self.answered, self.abandoned = list(answered), abandoned


@dataclass
class Deadline:
    """``seconds`` from now, on a monotonic ``clock``.

    >>> ticks = iter([10.0, 10.4, 11.5])
    >>> d = Deadline(1.0, clock=lambda: next(ticks))
    >>> round(d.left(), 2), d.left()
    (0.6, -0.5)
    """

    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.started + self.seconds - self.clock()

    def request_options(self) -> dict[str, Any]:
        """The ``openai`` request options bounding one request by the time left; :class:`DeadlinePassed`
        when none is left (nothing is sent then).

        >>> Deadline(2.0, clock=lambda: 5.0).request_options()
        {'timeout': 2.0, 'max_retries': 0}
        """
        left = self.left()
        if left <= 0:
            raise DeadlinePassed()
        return {"timeout": left, "max_retries": 0}


def partial_order(n: int, decided: Sequence[int]) -> list[int]:
    """The ``decided`` passages first, in their order, then the others in first-stage order.

    >>> partial_order(6, [4, 1])
    [4, 1, 0, 2, 3, 5]
    """
    chosen = set(decided)
    return [*decided, *(i for i in range(n) if i not in chosen)]


def deadline_note(seconds: float | None, decided: int, n: int) -> str:
    """What a cut ranking says.

    >>> deadline_note(1.5, 3, 20)
    'deadline 1.5 s passed after 3 of 20 places were decided: places 4-20 are in first-stage order'
    >>> deadline_note(1.5, 0, 20)
    'deadline 1.5 s passed before any place was decided: the list is in first-stage order'
    """
    if not decided:
        return f"deadline {seconds:g} s passed before any place was decided: the list is in first-stage order"
    return (f"deadline {seconds:g} s passed after {decided} of {n} places were decided: places {decided + 1}-{n} "
            "are in first-stage order")


def deadline_skip_note(seconds: float | None, skipped: int, top: int) -> str:
    """What a long list says when lower windows were left out so that the top window could be ranked in time.

    >>> print(deadline_skip_note(60, 14, 20)[:60])
    deadline 60 s: 14 lower window(s) not ranked, to leave the t
    """
    return (f"deadline {seconds:g} s: {skipped} lower window(s) not ranked, to leave the top window (passages 1-{top} "
            "as they stood) the time it takes; passages below it keep their order so far")


def first_stage(n: int, method: str, seconds: float | None, notes: Sequence[str] = ()) -> Ranking:
    """The ranking returned when the deadline passed before any place was decided."""
    order = list(range(n))
    scores = tuple((n - r - 1) / n for r in range(n))
    return Ranking(tuple(order), scores, method, notes=(*notes, deadline_note(seconds, 0, n)), decoded=0, partial=True)


def finish(flow: Flow[Any], passed: DeadlinePassed) -> Any:
    """Throw ``passed`` into a flow that handles it, and return what it returns (:func:`~.strategies.parallel`
    ends each of its flows so). A flow that asks for more requests instead is closed and ``passed`` raised."""
    try:
        flow.throw(passed)
    except StopIteration as stop:
        return stop.value
    flow.close()
    raise passed
