"""One deciding query of the content check on the real server: its time, requests and prompt tokens (issue 35).

The query rule reads a list under 20 passages in 13 first-step prompts (6 orders with the query, 6 without, the
empty prompt). Each passage gets a fresh salt, so nothing is cached from an earlier run.

    python benchmarks/check_reading.py --base-url http://127.0.0.1:8080/v1 [--list 0] [--passages 10]

Prints one JSON line and appends it to ``benchmarks/results/check-reading.jsonl`` with the code's commit, so two
versions are compared by running this on each (one after the other, on the same idle server).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capcal_integrations import CapCalReranker  # noqa: E402
from capcal_integrations.content_check.rules import RULES  # noqa: E402
from capcal_integrations.ranking.decoding import check_readings  # noqa: E402
from capcal_integrations.testbed.measure import bench_lists  # noqa: E402
from capcal_integrations.transport.drivers import run_sync  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "trec-dl19-passage"))
    ap.add_argument("--list", type=int, default=0, help="which query of --data (default the first)")
    ap.add_argument("--passages", type=int, default=10)
    args = ap.parse_args()
    b = bench_lists(args.data)[args.list]
    rr = CapCalReranker(base_url=args.base_url, model=args.model, timeout=3600, guard=None)
    caps = rr.capabilities()
    salt = f" ({random.randrange(10 ** 9)})"
    texts = [p + salt for p in list(b.passages)[:args.passages]]
    started = time.perf_counter()
    _, usage = run_sync(check_readings(rr._state.for_ranking(), rr.options.replace(alpha=1.0), b.query, texts,
                                       RULES["query"]), rr.client)
    commit = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    row = {"commit": commit, "server": caps.server, "slots": caps.slots, "passages": len(texts),
           "seconds": round(time.perf_counter() - started, 1), "requests": usage.requests,
           "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens}
    print(json.dumps(row))
    with open(HERE / "results" / "check-reading.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
