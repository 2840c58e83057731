"""Lazy capcal against the whole reading on the testbed (issue 49): the same orders, from how many trie nodes.

Each list is ranked twice by ``method="capcal"`` (``guard=None``) on the testbed's simulated llama.cpp server
(:mod:`capcal_integrations.testbed`, its :class:`~capcal_integrations.testbed.model.SlotModel`): lazily (middle
steps ask only the nodes a certified choice needs, ``reading/certified.py``) and whole (the endpoint's kind read as
one whose prompts cost nothing of their own: every node asked, as before). Reported per scenario and strength: lists,
identical orders, middle steps certified before every node was read, and the nodes (prompts) asked per list by
each. The scenarios (synthetic lists, grades drawn 0-3, seeded):

* **flat**: the 0.5B's fitted prior, content slope 0.3 (flat real distributions: adaptive alpha at its cap);
* **peaked prior**: the prior tripled, slope 3;
* **ties**: all but the top 8 labels tied at a floor;
* **heavy tails**: Student-t noise, 3 degrees of freedom;
* **mixed lengths**: lists of 3 to 30 passages (the 0.5B's prior and real-vs-empty mismatch);
* **windows**: lists of 100 passages, the sliding window (20, stride 10) over them (per-list noise scales);

each with a fixed strength (1) and the adaptive rule, and the raw form (``normalise=False``, the release's) on the
peaked prior.

    python benchmarks/lazy_capcal.py [--lists 50] [--window-lists 10] [--out benchmarks/results/lazy-capcal]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import random
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations.testbed import SimulatedEndpoint  # noqa: E402
from capcal_integrations.testbed.endpoint import PassageIndex, SimulatedServer, _prompt_list  # noqa: E402
from capcal_integrations.testbed.model import SCENARIOS  # noqa: E402
from capcal_integrations.testing import every_node  # noqa: E402

WORDS = "fleas cats dogs river mountain city sun moon star tree leaf rock salt iron gold rain snow wind".split()
PEAKED = SCENARIOS["no-delta"].replace(prior=tuple(3 * x for x in SCENARIOS["no-delta"].prior), name="peaked-prior")
#: name -> (model, content slope, list lengths drawn from)
SCENARIO_ROWS = {"flat": (SCENARIOS["no-delta"], 0.3, (20, 20)), "peaked prior": (PEAKED, 3.0, (20, 20)),
                 "ties": (SCENARIOS["ties"], 1.0, (20, 20)), "heavy tails": (SCENARIOS["heavy-tails"], 1.0, (20, 20)),
                 "mixed lengths": (SCENARIOS["delta-0.5b"], 1.0, (3, 30)),
                 "windows": (SCENARIOS["noise-scale-1"], 1.0, (100, 100))}


class Counting(SimulatedServer):
    """The testbed's server, counting the prompts (trie nodes) it is asked."""

    asked = 0

    def _completions(self, body):
        self.asked += len(_prompt_list(body.get("prompt")))
        return super()._completions(body)





def synthetic(k: int, lengths: tuple[int, int], seed: int) -> list[tuple[str, list[str], list[int]]]:
    rng = random.Random(seed)
    out = []
    for q in range(k):
        n = rng.randint(*lengths)
        passages = [f"{WORDS[(q + i) % len(WORDS)].title()} passage {q}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(9))
                    for i in range(n)]
        out.append((f"query {seed}-{q}", passages, [rng.choice((0, 0, 0, 1, 2, 3)) for _ in range(n)]))
    return out


def row(name: str, alpha: float | str, k: int, seed: int, **options) -> dict:
    model, s, lengths = SCENARIO_ROWS[name]
    data = synthetic(k, lengths, seed)
    server = Counting(PassageIndex(data), model.replace(s=s, seed=seed))
    endpoint = SimulatedEndpoint(server)
    asked, orders, seconds, middle, certified = [], [], [], 0, 0
    for lazy in (True, False):
        rr = endpoint.reranker(method="capcal", alpha=alpha, guard=None, **options)
        rr.capabilities()
        before, start = server.asked, time.perf_counter()
        with contextlib.nullcontext(rr) if lazy else every_node(rr):
            rankings = [rr.rerank(q, p) for q, p, _ in data]
        seconds.append(time.perf_counter() - start)
        asked.append(server.asked - before)
        orders.append([r.order for r in rankings])
        if lazy:
            for r in rankings:  # middle steps: not the first or last of a window
                by_window: dict[int, list] = {}
                for step in r.steps:
                    by_window.setdefault(step.window, []).append(step)
                for steps in by_window.values():
                    middle += max(0, len(steps) - 2)
                    certified += sum(s.pruned > 0 for s in steps)
    return {"scenario": name, "alpha": alpha, "form": "raw" if options.get("normalise") is False else "normalised",
            "lists": len(data), "identical": sum(a == b for a, b in zip(*orders)),
            "nodes_lazy": asked[0] / len(data), "nodes_whole": asked[1] / len(data),
            "middle_steps": middle, "certified_early": certified,
            "seconds_lazy": seconds[0], "seconds_whole": seconds[1]}


def markdown(rows: list[dict], command: str) -> str:
    lines = ["# Lazy capcal against the whole reading (testbed replay, issue 49)", "",
             f"`{command}`", "",
             "Each list ranked by capcal twice on the testbed's simulated llama.cpp server: lazily (middle steps ask the",
             "trie nodes a certified choice needs) and whole (every node). *identical*: lists whose orders are the same;",
             "*certified early*: middle steps (not a window's first or last) certified before every node was read;",
             "*nodes*: prompts asked per list (both streams). Seconds are the replay's own (no server compute).", "",
             "| scenario | alpha | form | lists | identical | middle steps certified early | nodes / list, lazy | "
             "nodes / list, whole | lazy / whole |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['alpha']} | {r['form']} | {r['lists']} | {r['identical']} | "
                     f"{r['certified_early']} / {r['middle_steps']} | {r['nodes_lazy']:.1f} | {r['nodes_whole']:.1f} | "
                     f"{r['nodes_lazy'] / r['nodes_whole']:.2f} |")
    total = sum(r["lists"] for r in rows)
    same = sum(r["identical"] for r in rows)
    lazy = sum(r["nodes_lazy"] * r["lists"] for r in rows)
    whole = sum(r["nodes_whole"] * r["lists"] for r in rows)
    lines += ["", f"**{same} of {total} lists identical**; nodes asked, all lists: {lazy:.0f} lazy against {whole:.0f} "
              f"whole ({lazy / whole:.2f}).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lists", type=int, default=50, help="lists per scenario and strength (not windows)")
    parser.add_argument("--window-lists", type=int, default=10, help="100-passage lists per strength")
    parser.add_argument("--raw-lists", type=int, default=20, help="lists of the raw form (peaked prior, adaptive)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results" / "lazy-capcal"))
    args = parser.parse_args()
    rows = []
    for k, (name, alpha) in enumerate((n, a) for n in SCENARIO_ROWS for a in (1.0, "adaptive")):
        lists = args.window_lists if name == "windows" else args.lists
        rows.append(row(name, alpha, lists, args.seed * 1000 + k))
        print(json.dumps(rows[-1]), flush=True)
    if args.raw_lists:
        rows.append(row("peaked prior", "adaptive", args.raw_lists, args.seed * 1000 + 99, normalise=False))
        print(json.dumps(rows[-1]), flush=True)
    command = "python benchmarks/lazy_capcal.py " + " ".join(sys.argv[1:])
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"command": command.strip(), "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, command.strip()))
    print(markdown(rows, command.strip()))


if __name__ == "__main__":
    main()
