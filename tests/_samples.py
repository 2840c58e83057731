"""A small query and passage list shared by the end-to-end tests (one clearly relevant passage, [2]), and the tiny
DL19 fixture's lists."""

import gzip
import json
import pathlib

QUERY = "how long is the life cycle of a flea"
PASSAGES = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "The flea life cycle from egg to adult takes two weeks to eight months, depending on conditions.",
    "Bananas are rich in potassium and easy to digest.",
    "Cats and dogs often carry fleas; treat pets every month.",
    "The stock market closed higher on Tuesday.",
]


def dl19_lists() -> list[tuple[str, list[str]]]:
    """The DL19 lists of tests/fixtures/tiny-dl (3 queries x 5 BM25 candidates)."""
    path = pathlib.Path(__file__).parent / "fixtures" / "tiny-dl" / "candidates.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [(t["query"], [c["text"] for c in t["candidates"]]) for t in map(json.loads, f)]
