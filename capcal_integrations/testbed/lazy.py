"""Lazy capcal against the whole reading on the testbed: the same orders, from how many trie nodes.

Each list is ranked twice by ``method="capcal"`` (``guard=None``) on the testbed's simulated llama.cpp server:
lazily (middle steps ask only the nodes a certified choice needs, :mod:`..reading.certified`) and whole (every
node, :func:`..testing.every_node`). :data:`SCENARIOS` (synthetic lists, grades drawn 0-3, seeded):

* **flat**: the 0.5B's fitted prior, content slope 0.3 (flat real distributions: adaptive alpha at its cap);
* **peaked prior**: the prior tripled, slope 3;
* **ties**: all but the top 8 labels tied at a floor;
* **heavy tails**: Student-t noise, 3 degrees of freedom;
* **mixed lengths**: lists of 3, 7, 13 and 30 passages (the 0.5B's prior and real-vs-empty mismatch);
* **windows of a 100-passage list**: the sliding window (20, stride 10) over each list.

Used by ``tests/test_lazy_capcal.py`` and ``python -m benchmarks.fidelity lazy --testbed``.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Any

from ..testing import every_node
from .endpoint import PassageIndex, SimulatedServer, _prompt_list
from .model import SCENARIOS as MODELS
from .model import SlotModel

__all__ = ["SCENARIOS", "Replayed", "synthetic", "replay"]

WORDS = "fleas cats dogs river mountain city sun moon star tree leaf rock salt iron gold rain snow wind".split()
_PEAKED = MODELS["no-delta"].replace(prior=tuple(3 * x for x in MODELS["no-delta"].prior), name="peaked-prior")
#: name -> (model, content slope, list lengths, cycled)
SCENARIOS: dict[str, tuple[SlotModel, float, tuple[int, ...]]] = {
    "flat": (MODELS["no-delta"], 0.3, (20,)), "peaked prior": (_PEAKED, 3.0, (20,)),
    "ties": (MODELS["ties"], 1.0, (20,)), "heavy tails": (MODELS["heavy-tails"], 1.0, (20,)),
    "mixed lengths": (MODELS["delta-0.5b"], 1.0, (3, 7, 13, 30)),
    "windows of a 100-passage list": (MODELS["noise-scale-1"], 1.0, (100,))}


class _Counting(SimulatedServer):
    """The testbed's server, counting the prompts (trie nodes) it is asked."""

    asked = 0

    def _completions(self, body: dict[str, Any]) -> Any:
        self.asked += len(_prompt_list(body.get("prompt")))
        return super()._completions(body)


@dataclass(frozen=True)
class Replayed:
    """One scenario's lists ranked both ways: how many, how many in the same order, the nodes each asked (all
    lists), and the middle steps (not a window's first or last) and those certified before every node was read."""

    lists: int
    identical: int
    nodes_lazy: int
    nodes_whole: int
    middle_steps: int
    certified_early: int


def synthetic(k: int, lengths: tuple[int, ...], seed: int = 0) -> list[tuple[str, list[str], list[int]]]:
    """``k`` lists (query, passages, grades), their lengths cycling through ``lengths``."""
    rng = random.Random(seed)
    out = []
    for q in range(k):
        n = lengths[q % len(lengths)]
        passages = [f"{WORDS[(q + i) % len(WORDS)].title()} passage {q}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(9))
                    for i in range(n)]
        out.append((f"query {seed}-{q}", passages, [rng.choice((0, 0, 0, 1, 2, 3)) for _ in range(n)]))
    return out


def replay(name: str, alpha: float | str, k: int, seed: int = 0, **options: Any) -> Replayed:
    """Scenario ``name``'s ``k`` lists ranked lazily and whole at strength ``alpha`` (``options``: the reranker's)."""
    from . import SimulatedEndpoint

    model, s, lengths = SCENARIOS[name]
    data = synthetic(k, lengths, seed)
    server = _Counting(PassageIndex(data), model.replace(s=s, seed=seed))
    endpoint = SimulatedEndpoint(server)
    asked, orders, middle, early = [], [], 0, 0
    for lazy in (True, False):
        rr = endpoint.reranker(method="capcal", alpha=alpha, guard=None, **options)
        before = server.asked
        with contextlib.nullcontext(rr) if lazy else every_node(rr):
            rankings = [rr.rerank(q, p) for q, p, _ in data]
        asked.append(server.asked - before)
        orders.append([r.order for r in rankings])
        for r in rankings if lazy else ():
            windows: dict[int, list] = {}
            for step in r.steps:
                windows.setdefault(step.window, []).append(step)
            middle += sum(max(0, len(steps) - 2) for steps in windows.values())
            early += sum(step.pruned > 0 for step in r.steps)
    return Replayed(len(data), sum(a == b for a, b in zip(*orders)), asked[0], asked[1], middle, early)
