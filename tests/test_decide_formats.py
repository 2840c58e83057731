"""capcal decide from the files teams have (issue 50): a BEIR folder (with a run, or BM25 over its corpus), a
TREC run + qrels, a JSONL of judged triples and the shared data layout; each the triples it stands for, each
deciding as the core does on them; a malformed file of each kind named with its line. And what the decision
saw: the worst and best queries, the plot beside the decision."""

from __future__ import annotations

import gzip
import json
import pathlib
import sys

import pytest

from capcal_integrations.commands import cli
from capcal_integrations.commands import judged_files as files
from capcal_integrations.commands.decide import judged_from, read_triples, run
from capcal_integrations.content_check.decision import ContentDecision
from capcal_integrations.errors import InputError
from capcal_integrations.testbed import simulated_endpoint
from capcal_integrations.types import Document

ROOT = pathlib.Path(__file__).resolve().parent
BEIR = ROOT / "fixtures" / "beir-small"
SCIFACT = ROOT.parent.parent / "shared" / "data" / "beir-scifact-test"


def _args(*argv: str):
    return cli.build_parser().parse_args(["decide", *argv])


def _expected_beir(top: int = 20) -> list[tuple[str, list[Document], list[int]]]:
    """The fixture's triples, read here by hand: the run's order, BEIR's title and text, the TSV's grades."""
    corpus = {d["_id"]: Document(d["text"], d["_id"], d["title"])
              for d in map(json.loads, (BEIR / "corpus.jsonl").read_text().splitlines())}
    queries = {q["_id"]: q["text"] for q in map(json.loads, (BEIR / "queries.jsonl").read_text().splitlines())}
    grades: dict[str, dict[str, int]] = {}
    for line in (BEIR / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, g = line.split("\t")
        grades.setdefault(q, {})[d] = int(g)
    ranked: dict[str, list[str]] = {}
    for line in (BEIR / "run.trec").read_text().splitlines():
        q, _, d, _, _, _ = line.split()
        ranked.setdefault(q, []).append(d)
    out = []
    for q, docs in ranked.items():
        g = [grades.get(q, {}).get(d, 0) for d in docs[:top]]
        if any(g):
            out.append((queries[q], [corpus[d] for d in docs[:top]], g))
    return out


def _served(triples, seed: int):
    """A simulated reranker that knows ``triples``' passages (by their text) and grades."""
    def text(p):
        return p if isinstance(p, str) else f"Title: {p.title} Content: {p.text}" if p.title else p.text

    texts = [(q, [text(p) for p in passages], g) for q, passages, g in triples]
    return simulated_endpoint(texts, s=2.0, seed=seed).reranker()


def _decides_as_the_core(args, triples, capsys, seed: int = 7) -> ContentDecision:
    """``run(args)`` on a simulated endpoint serving ``triples`` prints the decision the core takes on them."""
    assert run(args, _served(triples, seed)) == 0
    printed = ContentDecision.from_json(capsys.readouterr().out)
    core = _served(triples, seed).decide(triples)
    assert (printed.judged, printed.reads, printed.gain, printed.gain_low, printed.gain_high) == \
        (core.judged, core.reads, core.gain, core.gain_low, core.gain_high)
    return printed


def test_a_beir_folder_with_a_run_is_its_triples_and_decides_as_they_do(capsys):
    args = _args("--data", str(BEIR), "--run", str(BEIR / "run.trec"), "--json")
    triples = read_triples(args)
    assert triples == _expected_beir() and len(triples) >= 6
    assert read_triples(_args("--data", str(BEIR), "--run", str(BEIR / "run.trec"), "--top", "3")) == \
        [(q, p[:3], g[:3]) for q, p, g in _expected_beir() if any(g[:3])]
    _decides_as_the_core(args, triples, capsys)


def test_a_beir_folder_without_a_run_ranks_its_corpus_by_bm25(capsys, monkeypatch):
    args = _args("--data", str(BEIR), "--top", "5", "--json")
    triples = read_triples(args)
    # the fixture's run is this BM25's (written by the pure-Python one): bm25s, where installed, agrees
    assert [[d.id for d in p] for _, p, _ in triples] == [[d.id for d in p] for _, p, _ in _expected_beir(5)]
    monkeypatch.setitem(sys.modules, "bm25s", None)  # the pure-Python fallback
    assert read_triples(args) == triples
    _decides_as_the_core(args, triples, capsys)


def test_a_trec_run_and_qrels_are_the_same_triples(tmp_path, capsys):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, d, g in
                             (line.split("\t") for line in (BEIR / "qrels" / "test.tsv").read_text().split("\n")[1:]
                              if line)).replace("\n\n", "\n"))
    args = _args("--run", str(BEIR / "run.trec"), "--qrels", str(qrels), "--corpus", str(BEIR / "corpus.jsonl"),
                 "--questions", str(BEIR / "queries.jsonl"), "--json")
    assert read_triples(args) == _expected_beir()
    # passages and questions as id<TAB>text files too
    (tmp_path / "corpus.tsv").write_text("".join(f"{d.id}\t{d.text}\n" for _, p, _ in _expected_beir() for d in p))
    (tmp_path / "queries.tsv").write_text("".join(f"{q['_id']}\t{q['text']}\n" for q in
                                                 map(json.loads, (BEIR / "queries.jsonl").read_text().splitlines())))
    tsv = read_triples(_args("--run", str(BEIR / "run.trec"), "--qrels", str(qrels), "--corpus",
                             str(tmp_path / "corpus.tsv"), "--questions", str(tmp_path / "queries.tsv")))
    assert [(q, [d.text for d in p], g) for q, p, g in tsv] == [(q, [d.text for d in p], g)
                                                               for q, p, g in _expected_beir()]
    _decides_as_the_core(args, read_triples(args), capsys)


def test_a_jsonl_of_triples_is_those_triples(tmp_path, capsys):
    triples = [(q, [d.text for d in p], g) for q, p, g in _expected_beir()]
    path = tmp_path / "judged.jsonl"
    path.write_text("".join(json.dumps({"query": q, "passages": p, "grades": g}) + "\n" for q, p, g in triples))
    args = _args("--judged", str(path), "--json")
    assert read_triples(args) == triples
    _decides_as_the_core(args, triples, capsys)
    # a later line for the same query is its newest grading; passages as objects keep their title and id
    with path.open("a") as f:
        f.write(json.dumps({"query": triples[0][0], "passages": [{"text": "x", "title": "T", "id": "7"}, "y"],
                            "grades": [0, 2]}) + "\n")
    assert read_triples(args)[0] == (triples[0][0], [Document("x", "7", "T"), "y"], [0, 2])


def test_the_shared_layout_is_still_read(tmp_path):
    triples = [(q, [d.text for d in p], g) for q, p, g in _expected_beir()]
    with gzip.open(tmp_path / "candidates.jsonl.gz", "wt") as f:
        for i, (q, p, _) in enumerate(triples):
            f.write(json.dumps({"qid": f"q{i}", "query": q,
                                "candidates": [{"docid": f"d{i}-{j}", "text": t} for j, t in enumerate(p)]}) + "\n")
    (tmp_path / "qrels.txt").write_text("".join(f"q{i} 0 d{i}-{j} {x}\n" for i, (_, _, g) in enumerate(triples)
                                                for j, x in enumerate(g) if x))
    read = read_triples(_args("--data", str(tmp_path)))
    assert [(q, [d.text for d in p], g) for q, p, g in read] == triples == \
        [(q, [d.text for d in p], g) for q, p, g in judged_from(str(tmp_path))]


@pytest.mark.parametrize("name, text, says", [
    ("judged.jsonl", '{"query": "q", "passages": ["a"], "grades": [1]}\n{"query": "q",\n', "line 2: not JSON"),
    ("judged.jsonl", '{"query": "q", "passages": ["a", "b"], "grades": [1]}\n', "line 1: 2 passages but 1 grades"),
    ("judged.jsonl", '\n{"query": "q", "passages": ["a"], "grades": [-1]}\n', "line 2: grades must be integers"),
    ("run.trec", "q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\nq1 Q0 d3 3\n", "line 3: expected 'qid Q0 docid rank score"),
    ("run.trec", "q1 Q0 d1 one 2.0 x\n", "line 1: rank 'one' must be an integer"),
    ("qrels.txt", "q1 0 d1 1\nq1 0 d2 high\n", "line 2: the grade 'high' is not an integer"),
])
def test_a_malformed_file_names_its_line(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    read = {"judged.jsonl": files.read_judged, "run.trec": files.read_run, "qrels.txt": files.read_qrels}[name]
    with pytest.raises(InputError, match=f"{name}, {says}"):
        read(path)


def test_a_malformed_beir_folder_names_its_file_and_line(tmp_path):
    import shutil

    folder = tmp_path / "beir"
    shutil.copytree(BEIR, folder)
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    lines[4] = json.dumps({"_id": "x", "title": "no text"})
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"corpus.jsonl, line 5: a corpus line needs \"_id\" and \"text\""):
        read_triples(_args("--data", str(folder)))
    shutil.copy(BEIR / "corpus.jsonl", folder / "corpus.jsonl")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq-fleas\tfleas-a\n")
    with pytest.raises(InputError, match=r"test.tsv, line 2: expected"):
        read_triples(_args("--data", str(folder)))
    (folder / "run.trec").write_text("q-fleas Q0 nowhere 1 1.0 x\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq-fleas\tfleas-a\t1\n")
    with pytest.raises(InputError, match="ranks 'nowhere', which the corpus does not hold"):
        read_triples(_args("--data", str(folder), "--run", str(folder / "run.trec")))


def test_the_format_is_told_or_named(tmp_path):
    with pytest.raises(InputError, match="neither the shared data layout"):
        read_triples(_args("--data", str(tmp_path)))
    with pytest.raises(InputError, match="needs judged queries"):
        read_triples(_args())
    with pytest.raises(InputError, match="--format trec needs --run --qrels --corpus --questions"):
        read_triples(_args("--format", "trec", "--data", str(BEIR)))
    assert read_triples(_args("--format", "beir", "--data", str(BEIR), "--run", str(BEIR / "run.trec"))) == \
        _expected_beir()


def test_what_the_decision_saw_is_listed_and_plotted_beside_it(tmp_path, capsys):
    triples = _expected_beir()
    out = tmp_path / "decision"
    args = _args("--data", str(BEIR), "--run", str(BEIR / "run.trec"), "--json", "--out", str(out))
    printed = _decides_as_the_core(args, triples, capsys, seed=8)
    assert run(args, _served(triples, 8)) == 0
    err = capsys.readouterr().err
    assert "what the decision saw" in err and "worst" in err and "best:" in err
    assert ContentDecision.from_json((out / "decision.json").read_text()).gain == printed.gain
    rows = [line.split("\t") for line in (out / "queries.tsv").read_text().splitlines()[1:]]
    assert len(rows) == printed.judged
    # the per-query differences are the ones the decision's mean gain is of
    assert sum(float(r[2]) for r in rows) / len(rows) == pytest.approx(printed.gain, abs=1e-3)
    svg = (out / "queries.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<title>") == len(rows) + 1
    assert ("calibrate" if printed.reads else "keep the given order") in svg


def _write_beir(source: pathlib.Path, folder: pathlib.Path) -> None:
    """A BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) and a TREC run from the shared data layout."""
    import shutil

    (folder / "qrels").mkdir(parents=True)
    corpus: dict[str, dict] = {}
    with gzip.open(source / "candidates.jsonl.gz", "rt", encoding="utf-8") as f, \
            (folder / "queries.jsonl").open("w") as queries:
        for line in f:
            topic = json.loads(line)
            queries.write(json.dumps({"_id": topic["qid"], "text": topic["query"], "metadata": {}}) + "\n")
            for c in topic["candidates"]:
                corpus[c["docid"]] = {"_id": c["docid"], "title": c.get("title", ""), "text": c["text"]}
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus.values()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        "{}\t{}\t{}\n".format(*(line.split()[i] for i in (0, 2, 3)))
        for line in (source / "qrels.txt").read_text().splitlines() if line.strip()))
    shutil.copy(source / "run.bm25.txt", folder / "run.trec")


@pytest.mark.skipif(not SCIFACT.exists(), reason="../shared/data/beir-scifact-test is not here")
def test_a_beir_folder_written_from_scifact_is_the_shared_data(tmp_path, capsys):
    folder = tmp_path / "scifact"
    _write_beir(SCIFACT, folder)
    beir = read_triples(_args("--data", str(folder), "--run", str(folder / "run.trec")))
    shared = judged_from(str(SCIFACT), top=20)
    assert len(beir) == len(shared) > 200
    assert {q: ([d.id for d in p], [d.title for d in p], g) for q, p, g in beir} == \
        {q: ([d.id for d in p], [d.title for d in p], g) for q, p, g in shared}
    # BM25 over the BEIR corpus (here: the union of the candidates) finds most of the same relevant passages
    bm25 = read_triples(_args("--data", str(folder), "--queries", "50"))
    assert len(bm25) >= 40
    args = _args("--data", str(folder), "--run", str(folder / "run.trec"), "--queries", "5", "--top", "6", "--json")
    _decides_as_the_core(args, read_triples(args), capsys)


def test_a_malformed_file_fails_before_any_server_starts(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "judged.jsonl"
    bad.write_text('{"query": "q", "passages": ["a", "b"], "grades": [1, "x"]}\n')

    def no_server(args):
        raise AssertionError("an endpoint was started for a file that cannot be read")

    monkeypatch.setattr(cli, "_endpoint", no_server)
    assert cli.main(["decide", "--judged", str(bad)]) == 1
    assert "judged.jsonl, line 1: grades must be integers" in capsys.readouterr().err
