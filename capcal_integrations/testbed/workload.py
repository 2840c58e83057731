"""What the testbed ranks, and how it reaches the reranker: the lists taken from a dataset and the traffic shapes.

:func:`bench_lists` takes the first candidates of every topic of a dataset as :class:`BenchList` (the query,
its passages in first-stage order, their grades and every judged grade of the query).

**Traffic shapes** (:data:`SHAPES`): ``fixed`` ranks every list as loaded (the top 20), one after
another; ``mixed`` cuts each list to a length drawn from 3..30 (a similarity cut-off or ``top_k``);
``windows`` cuts each to a length drawn from 50..100 (DL19 and DL20 have 100 candidates per query) and the
library slides its window (20 passages, stride 10) over it; ``concurrent`` ranks the top 20 of every list
8 at a time (``arerank_many(concurrency=8)``). Lengths are drawn per draw and list (the same for every
method of a draw); :data:`SHAPE_TOP` is how many candidates each shape needs from the data. :mod:`.measure`
ranks them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputError

__all__ = ["BenchList", "bench_lists", "SHAPES", "SHAPE_TOP", "LENGTHS", "CONCURRENCY", "shaped"]


@dataclass(frozen=True)
class BenchList:
    """One list: its query, passages in first-stage order, their grades, and every judged grade of the query."""

    query: str
    passages: tuple[str, ...]
    grades: tuple[int, ...]
    ideal: tuple[int, ...]


#: The traffic shapes (see the module docstring).
SHAPES: dict[str, str] = {
    "fixed": "every list as loaded (the top 20), one after another",
    "mixed": "each list cut to a length drawn from 3..30, one after another",
    "windows": "each list cut to a length drawn from 50..100 and ranked with the sliding window (20, stride 10)",
    "concurrent": "the top 20 of every list, 8 lists at a time (arerank_many, concurrency 8)",
}
#: Candidates per list each shape needs from the data (``bench_lists(data, top)``).
SHAPE_TOP = {"fixed": 20, "mixed": 30, "windows": 100, "concurrent": 20}
#: The range of list lengths a shape draws from (inclusive), per list and draw.
LENGTHS = {"mixed": (3, 30), "windows": (50, 100)}
#: Lists in flight at once in the ``concurrent`` shape.
CONCURRENCY = 8


def bench_lists(data: Any, top: int = 20) -> list[BenchList]:
    """The first ``top`` candidates of every topic of a dataset (a directory in the shared format or a
    :class:`~capcal_integrations.evaluation.data.Dataset`)."""
    from ..evaluation.data import load_dataset

    dataset = load_dataset(data) if not hasattr(data, "topics") else data
    grades = dataset.grades()
    out = []
    for t in dataset.topics:
        judged = grades.get(t.qid, {})
        cands = t.candidates[:top]
        out.append(BenchList(t.query, tuple(c.text if not c.title else f"Title: {c.title} Content: {c.text}" for c in cands),
                             tuple(judged.get(c.docid, 0) for c in cands), tuple(sorted(judged.values(), reverse=True))))
    if not out:
        raise InputError("the dataset has no topics")
    return out


def shaped(lists: Sequence[BenchList], shape: str, seed: int = 0, draw: int = 0) -> list[BenchList]:
    """The lists as ``shape`` sends them in draw ``draw``: ``mixed`` and ``windows`` cut each list to a length
    drawn from :data:`LENGTHS` (at most what the list has), the others leave them as they are.

    >>> lists = [BenchList(f"q{i}", tuple(f"p{j}" for j in range(100)), (0,) * 100, ()) for i in range(50)]
    >>> lengths = [len(b.passages) for b in shaped(lists, "mixed", draw=1)]
    >>> min(lengths) >= 3 and max(lengths) <= 30 and len(set(lengths)) > 5, lengths == [len(b.passages) for b in
    ...     shaped(lists, "mixed", draw=1)]
    (True, True)
    """
    if shape not in SHAPES:
        raise InputError(f"unknown traffic shape {shape!r}; choose one of {', '.join(SHAPES)}")
    span = LENGTHS.get(shape)
    if span is None:
        return list(lists)
    rng = random.Random(f"{seed}/{draw}/{shape}")
    out = []
    for b in lists:
        n = min(len(b.passages), rng.randint(*span))
        out.append(replace(b, passages=b.passages[:n], grades=b.grades[:n]))
    return out
